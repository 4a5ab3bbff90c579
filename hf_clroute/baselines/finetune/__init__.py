"""Naive fine-tuning: the whole backbone and head on each task in turn (the lower bound)."""

from hf_clroute.baselines.finetune.config import FinetuneConfig
from hf_clroute.baselines.finetune.method import Finetune
from hf_clroute.core.registry import register_method

register_method(FinetuneConfig, Finetune)

__all__ = ["Finetune", "FinetuneConfig"]
