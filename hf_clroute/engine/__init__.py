"""The engine: the continual loop on Accelerate, evaluation, checkpoints, callbacks."""

from .callbacks import Callback
from .evaluation import EvalTimer, evaluate_experience, test_loader
from .trainer import ContinualTrainer, StreamResult, TrainingConfig, make_accelerator

__all__ = [
    "Callback",
    "ContinualTrainer",
    "EvalTimer",
    "StreamResult",
    "TrainingConfig",
    "evaluate_experience",
    "make_accelerator",
    "test_loader",
]
