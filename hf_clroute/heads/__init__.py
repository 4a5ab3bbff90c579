"""Classification heads: a trained linear head and closed-form statistics heads."""

from hf_clroute.heads.base import StatisticsHead
from hf_clroute.heads.factory import (
    HEAD_KINDS,
    build_head,
    check_head_options,
    head_parameters,
)
from hf_clroute.heads.lda import StreamingLDAHead
from hf_clroute.heads.linear import IncrementalClassifier, task_mask_logits
from hf_clroute.heads.prototype import PrototypeHead
from hf_clroute.heads.ranpac import RandomProjectionRidgeHead

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
