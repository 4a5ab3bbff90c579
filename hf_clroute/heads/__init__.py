"""Classification heads: a trained linear head and closed-form statistics heads."""

from .base import StatisticsHead
from .factory import HEAD_KINDS, build_head, check_head_options, head_parameters
from .lda import StreamingLDAHead
from .linear import IncrementalClassifier, task_mask_logits
from .prototype import PrototypeHead
from .ranpac import RandomProjectionRidgeHead

__all__ = [
    "HEAD_KINDS",
    "IncrementalClassifier",
    "PrototypeHead",
    "RandomProjectionRidgeHead",
    "StatisticsHead",
    "StreamingLDAHead",
    "build_head",
    "check_head_options",
    "head_parameters",
    "task_mask_logits",
]
