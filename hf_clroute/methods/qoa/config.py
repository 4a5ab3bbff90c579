"""Configuration of QOA (query-only attention over a replay buffer), SPEC section 5.

The paper writes the prediction as ``y_hat = sum_j d_j y_j`` with
``d_j = Q_theta(x_t, x_j, y_j)`` and does not insist on a normalisation of the
scores; attention normalises them with a softmax over the context, which makes
``y_hat`` a convex combination of the support labels (a probability vector for
one-hot labels). That is our default (``score_normalization="softmax"``);
``"mean"`` keeps the raw scores, averaged over the support set, and reads
``y_hat`` as class logits (classification) or the output (regression).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import CLConfig


@dataclass
class QoaConfig(CLConfig):
    method = "qoa"

    buffer_size: int = field(
        default=2000,
        metadata={"help": "Capacity of the reservoir replay buffer of (features, label) the support set is drawn from."},
    )
    support_size: int = field(
        default=200,
        metadata={"help": "Support items drawn (without replacement) from the buffer for every training forward."},
    )
    eval_support_size: int = field(
        default=0,
        metadata={
            "help": "Support items at evaluation: 0 = the whole buffer (exact, deterministic), n > 0 = n drawn "
            "per evaluation with a generator seeded by (seed, items seen)."
        },
    )
    hidden_size: int = field(default=128, metadata={"help": "Width of the scorer MLP Q_theta."})
    num_layers: int = field(default=2, metadata={"help": "Hidden layers of the scorer MLP (>= 1)."})
    task: str = field(
        default="classification",
        metadata={"help": "'classification' (one-hot labels, cross-entropy) or 'regression' (real targets, MSE)."},
    )
    max_classes: int = field(
        default=100,
        metadata={"help": "Width of the one-hot label input of the scorer: the most classes the head can predict."},
    )
    target_dim: int = field(default=1, metadata={"help": "Dimension of the regression target (task='regression')."})
    score_normalization: str = field(
        default="softmax",
        metadata={"help": "'softmax' over the support set (convex combination of labels) or 'mean' (raw scores / |S|)."},
    )
    probability_floor: float = field(
        default=1e-4,
        metadata={
            "help": "Mixed into softmax predictions as (1-eps) y_hat + eps/C so a class absent from the support "
            "has a finite log-probability."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the support-set sampling and the scorer's initialisation."})

    TASKS: ClassVar[tuple[str, ...]] = ("classification", "regression")
    NORMALIZATIONS: ClassVar[tuple[str, ...]] = ("softmax", "mean")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("buffer_size", "support_size", "hidden_size", "num_layers", "max_classes", "target_dim")
        if not isinstance(self.eval_support_size, int) or self.eval_support_size < 0:
            raise ValueError(f"QoaConfig.eval_support_size must be an int >= 0, got {self.eval_support_size!r}")
        if self.task not in self.TASKS:
            raise ValueError(f"QoaConfig.task must be one of {self.TASKS}, got {self.task!r}")
        if self.score_normalization not in self.NORMALIZATIONS:
            raise ValueError(
                f"QoaConfig.score_normalization must be one of {self.NORMALIZATIONS}, got {self.score_normalization!r}"
            )
        if not 0.0 <= self.probability_floor < 1.0:
            raise ValueError(f"QoaConfig.probability_floor must be in [0, 1), got {self.probability_floor!r}")
        if not self.freeze_backbone:
            raise ValueError("QoaConfig.freeze_backbone must be True: the buffer stores fixed backbone features")

    @property
    def label_dim(self) -> int:
        """Width of the label vectors the scorer reads and the prediction combines."""
        return self.max_classes if self.task == "classification" else self.target_dim
