"""Visual prompt tuning (VPT-shallow, Jia et al. 2022) on a ViT: learned tokens after the CLS token."""

from hf_clroute.baselines.vpt.config import VPTConfig
from hf_clroute.baselines.vpt.method import VisualPromptTuning
from hf_clroute.core.registry import register_method

register_method(VPTConfig, VisualPromptTuning)

__all__ = ["VPTConfig", "VisualPromptTuning"]
