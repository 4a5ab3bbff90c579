"""Baselines that run on the same engine hooks as the methods."""

from ..registry import register_method
from .finetune import Finetune, FinetuneConfig
from .ncm import NCMConfig, NearestClassMean

register_method(FinetuneConfig, Finetune)
register_method(NCMConfig, NearestClassMean)

__all__ = ["Finetune", "FinetuneConfig", "NCMConfig", "NearestClassMean"]
