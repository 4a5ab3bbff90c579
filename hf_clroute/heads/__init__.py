"""Classification heads: trained linear and cosine heads, and closed-form statistics heads."""

from hf_clroute.heads.base import StatisticsHead
from hf_clroute.heads.cosine import CosineClassifier
from hf_clroute.heads.factory import (
    GRADIENT_HEAD_KINDS,
    HEAD_KINDS,
    STATISTICS_HEAD_KINDS,
    build_head,
    check_head_options,
    head_parameters,
)
from hf_clroute.heads.lda import StreamingLDAHead
from hf_clroute.heads.linear import IncrementalClassifier, task_mask_logits
from hf_clroute.heads.prototype import PrototypeHead
from hf_clroute.heads.ranpac import RandomProjectionRidgeHead

__all__ = [
    "GRADIENT_HEAD_KINDS",
    "HEAD_KINDS",
    "STATISTICS_HEAD_KINDS",
    "CosineClassifier",
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
