"""Online-LoRA: task-free LoRA, merged into the weights at loss plateaus, with importance-weighted penalty."""

from hf_clroute.baselines.online_lora.config import OnlineLoraConfig
from hf_clroute.baselines.online_lora.layer import MergeableLoRA
from hf_clroute.baselines.online_lora.method import OnlineLora
from hf_clroute.core.registry import register_method

register_method(OnlineLoraConfig, OnlineLora)

__all__ = ["MergeableLoRA", "OnlineLora", "OnlineLoraConfig"]
