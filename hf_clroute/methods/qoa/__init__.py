"""QOA: query-only attention over a replay buffer."""

from hf_clroute.core.registry import register_method
from hf_clroute.methods.qoa.config import QoaConfig
from hf_clroute.methods.qoa.head import (
    QoaLearner,
    QueryOnlyAttention,
    SimilarityAttention,
)
from hf_clroute.methods.qoa.method import Qoa

register_method(QoaConfig, Qoa)

__all__ = ["Qoa", "QoaConfig", "QoaLearner", "QueryOnlyAttention", "SimilarityAttention"]
