"""The engine: the continual loop on Accelerate, evaluation, checkpoints, callbacks."""

from hf_clroute.engine.callbacks import Callback
from hf_clroute.engine.evaluation import EvalTimer, evaluate_experience, test_loader
from hf_clroute.engine.trainer import (
    ContinualTrainer,
    StreamResult,
    TrainingConfig,
    make_accelerator,
)

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
