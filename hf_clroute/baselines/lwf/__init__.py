"""Learning without Forgetting (Li & Hoiem 2017), for class-incremental streams."""

from hf_clroute.baselines.lwf.config import LwFConfig
from hf_clroute.baselines.lwf.method import LwF
from hf_clroute.core.registry import register_method

register_method(LwFConfig, LwF)

__all__ = ["LwF", "LwFConfig"]
