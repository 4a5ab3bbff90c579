"""Shared machinery of the key-query prompt methods (L2P, DualPrompt, CODA-Prompt)."""

from .base import PromptPoolConfig, PromptPoolMethod, cosine_top
from .insertion import PrefixAttention, PromptInjector

__all__ = ["PrefixAttention", "PromptInjector", "PromptPoolConfig", "PromptPoolMethod", "cosine_top"]
