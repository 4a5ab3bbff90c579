"""DualPrompt: a shared G-prompt and key-matched task E-prompts, as prefixes on keys and values."""

from hf_clroute.baselines.dualprompt.config import DualPromptConfig
from hf_clroute.baselines.dualprompt.method import DualPrompt

__all__ = ["DualPrompt", "DualPromptConfig"]
