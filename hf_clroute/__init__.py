"""hf_clroute: routing methods for continual learning as PEFT-style adapters for HF backbones."""

from .config import CLConfig
from .engine import ContinualTrainer, StreamResult, TrainingConfig
from .model import CLModel, get_cl_model
from .registry import available_methods, get_method, register_method

__version__ = "0.1.0"

__all__ = [
    "CLConfig",
    "CLModel",
    "ContinualTrainer",
    "StreamResult",
    "TrainingConfig",
    "available_methods",
    "get_cl_model",
    "get_method",
    "register_method",
]
