"""CODA-Prompt: attention-weighted prompt components, new ones orthogonal to the frozen old ones."""

from .config import CodaPromptConfig
from .method import CodaPrompt, orthogonal_to

__all__ = ["CodaPrompt", "CodaPromptConfig", "orthogonal_to"]
