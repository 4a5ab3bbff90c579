"""Streaming LDA: class means and one shared shrunk covariance on frozen features; nothing is trained."""

from hf_clroute.baselines.slda.config import SLDAConfig
from hf_clroute.baselines.slda.method import StreamingLDA
from hf_clroute.core.registry import register_method

register_method(SLDAConfig, StreamingLDA)

__all__ = ["SLDAConfig", "StreamingLDA"]
