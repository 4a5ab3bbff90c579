"""Experience replay (ER) with a reservoir-sampled buffer of a stated size."""

from hf_clroute.baselines.er.config import ERConfig
from hf_clroute.baselines.er.method import ExperienceReplay
from hf_clroute.core.registry import register_method

register_method(ERConfig, ExperienceReplay)

__all__ = ["ERConfig", "ExperienceReplay"]
