"""Continual routing methods, one package each (added by their own issues)."""

from .base import ContinualMethod, StepContext

__all__ = ["ContinualMethod", "StepContext"]
