"""DualPrompt: a shared G-prompt and key-matched task E-prompts, as prefixes on keys and values."""

from hf_clroute.baselines.dualprompt.config import DualPromptConfig
from hf_clroute.baselines.dualprompt.method import DualPrompt
from hf_clroute.core.registry import register_method

register_method(DualPromptConfig, DualPrompt)

__all__ = ["DualPrompt", "DualPromptConfig"]
