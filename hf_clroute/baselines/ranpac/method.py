"""RanPAC's closed-form head (McDonnell et al. 2023) on a frozen backbone: a fixed random ReLU
projection of the features, then ridge regression to one-hot targets."""

from __future__ import annotations

from hf_clroute.baselines.class_statistics.method import FrozenStatisticsBaseline
from hf_clroute.baselines.ranpac.config import RanPACConfig


class RanPAC(FrozenStatisticsBaseline):
    """RanPAC's closed-form head on frozen features: random ReLU projection + ridge regression."""

    config_class = RanPACConfig
