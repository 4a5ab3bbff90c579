"""Streaming LDA (Hayes & Kanan 2020) on a frozen backbone: class means and one shared, shrunk
covariance, updated in one pass over the stream."""

from __future__ import annotations

from hf_clroute.baselines.class_statistics.method import FrozenStatisticsBaseline
from hf_clroute.baselines.slda.config import SLDAConfig


class StreamingLDA(FrozenStatisticsBaseline):
    """Streaming LDA on frozen features: class means, one shared shrunk covariance."""

    config_class = SLDAConfig
