"""LoRA from PEFT itself, as a continual baseline."""

from hf_clroute.baselines.lora.config import LoraBaselineConfig
from hf_clroute.baselines.lora.method import LoraBaseline
from hf_clroute.core.registry import register_method

register_method(LoraBaselineConfig, LoraBaseline)

__all__ = ["LoraBaseline", "LoraBaselineConfig"]
