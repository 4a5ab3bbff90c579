"""What the class-statistics baselines (simplecil, slda, ranpac, ncm) share: a frozen backbone and a
closed-form statistics head, with nothing trained."""

from hf_clroute.baselines.class_statistics.config import FrozenStatisticsConfig
from hf_clroute.baselines.class_statistics.method import FrozenStatisticsBaseline

__all__ = ["FrozenStatisticsBaseline", "FrozenStatisticsConfig"]
