"""Shared machinery of the key-query prompt methods (L2P, DualPrompt, CODA-Prompt)."""

from hf_clroute.baselines.prompt_pool.base import (
    PromptPoolConfig,
    PromptPoolMethod,
    cosine_top,
)
from hf_clroute.baselines.prompt_pool.insertion import PrefixAttention, PromptInjector

__all__ = ["PrefixAttention", "PromptInjector", "PromptPoolConfig", "PromptPoolMethod", "cosine_top"]
