"""Nearest class mean on frozen features (``simplecil`` under its older name); nothing is trained."""

from hf_clroute.baselines.ncm.config import NCMConfig
from hf_clroute.baselines.ncm.method import NearestClassMean
from hf_clroute.core.registry import register_method

register_method(NCMConfig, NearestClassMean)

__all__ = ["NCMConfig", "NearestClassMean"]
