"""SimpleCIL (Zhou et al. 2023) on a frozen backbone: one prototype per class (the mean feature),
scored by cosine similarity, i.e. nearest class mean, with no adaptation stage."""

from __future__ import annotations

from hf_clroute.baselines.class_statistics.method import FrozenStatisticsBaseline
from hf_clroute.baselines.simplecil.config import SimpleCILConfig


class SimpleCIL(FrozenStatisticsBaseline):
    """Nearest class mean (cosine) on frozen features: SimpleCIL, with no adaptation stage."""

    config_class = SimpleCILConfig
