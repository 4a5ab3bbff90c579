"""QOA: query-only attention over a replay buffer."""

from ...registry import register_method
from .config import QoaConfig
from .head import QoaLearner, QueryOnlyAttention, SimilarityAttention
from .method import Qoa

register_method(QoaConfig, Qoa)

__all__ = ["Qoa", "QoaConfig", "QoaLearner", "QueryOnlyAttention", "SimilarityAttention"]
