"""CODA-Prompt: attention-weighted prompt components, new ones orthogonal to the frozen old ones."""

from hf_clroute.baselines.coda_prompt.config import CodaPromptConfig
from hf_clroute.baselines.coda_prompt.method import CodaPrompt, orthogonal_to

__all__ = ["CodaPrompt", "CodaPromptConfig", "orthogonal_to"]
