"""CODA-Prompt: attention-weighted prompt components, new ones orthogonal to the frozen old ones."""

from hf_clroute.baselines.coda_prompt.config import CodaPromptConfig
from hf_clroute.baselines.coda_prompt.method import CodaPrompt, orthogonal_to
from hf_clroute.core.registry import register_method

register_method(CodaPromptConfig, CodaPrompt)

__all__ = ["CodaPrompt", "CodaPromptConfig", "orthogonal_to"]
