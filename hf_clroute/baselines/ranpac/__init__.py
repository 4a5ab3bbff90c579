"""RanPAC: a random ReLU projection of frozen features, then ridge regression; nothing is trained."""

from hf_clroute.baselines.ranpac.config import RanPACConfig
from hf_clroute.baselines.ranpac.method import RanPAC
from hf_clroute.core.registry import register_method

register_method(RanPACConfig, RanPAC)

__all__ = ["RanPAC", "RanPACConfig"]
