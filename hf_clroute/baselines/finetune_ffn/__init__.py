"""FFN-only fine-tuning: everything on the first task, then only the blocks' FFNs (and the head)."""

from hf_clroute.baselines.finetune_ffn.config import FfnFinetuneConfig
from hf_clroute.baselines.finetune_ffn.method import FfnFinetune
from hf_clroute.core.registry import register_method

register_method(FfnFinetuneConfig, FfnFinetune)

__all__ = ["FfnFinetune", "FfnFinetuneConfig"]
