"""Online-LoRA: task-free LoRA, merged into the weights at loss plateaus, with importance-weighted penalty."""

from .config import OnlineLoraConfig
from .layer import MergeableLoRA
from .method import OnlineLora

__all__ = ["MergeableLoRA", "OnlineLora", "OnlineLoraConfig"]
