"""DualPrompt: a shared G-prompt and key-matched task E-prompts, as prefixes on keys and values."""

from .config import DualPromptConfig
from .method import DualPrompt

__all__ = ["DualPrompt", "DualPromptConfig"]
