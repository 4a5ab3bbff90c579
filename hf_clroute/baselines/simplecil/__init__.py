"""SimpleCIL: nearest class mean (cosine) on frozen features; nothing is trained."""

from hf_clroute.baselines.simplecil.config import SimpleCILConfig
from hf_clroute.baselines.simplecil.method import SimpleCIL
from hf_clroute.core.registry import register_method

register_method(SimpleCILConfig, SimpleCIL)

__all__ = ["SimpleCIL", "SimpleCILConfig"]
