"""Configuration of QOA (query-only attention over a replay buffer).

The paper writes the prediction as ``y_hat = sum_j d_j y_j`` with
``d_j = Q_theta(x_t, x_j, y_j)`` and does not insist on a normalisation of the
scores; attention normalises them with a softmax over the context, which makes
``y_hat`` a convex combination of the support labels (a probability vector for
one-hot labels). That is our default (``score_normalization="softmax"``);
``"mean"`` keeps the raw scores, averaged over the support set, and reads
``y_hat`` as class logits (classification) or the output (regression).

Two scorers share that prediction rule. ``scorer="mlp"`` is the paper's
``Q_theta``, an MLP over ``[x_t; x_j; y_j]``. ``scorer="similarity"`` (the head's
default) scores ``cos(x_t, x_j) / temperature`` plus a learned residual MLP that
also reads the cosine; the residual starts at zero, so before training the head
is a cosine-similarity attention classifier over the buffer, which on frozen
features is about as accurate as cosine kNN, and training can only start from
there. An MLP over concatenated features has to discover similarity from a few
hundred online steps, and on split-mnist it did not.

The head (:class:`~.method.Qoa`) draws ``support_per_class`` items of every class
in the buffer as the support set, in training and at evaluation alike, and trains
on ``replay_queries`` buffer items per step besides the current batch: with only
the batch as queries, every training query is of the current task and the scorer
learns to favour it. The standalone learner of the plasticity suites
(:class:`~.head.QoaLearner`) keeps the paper's uniform ``support_size`` /
``eval_support_size`` draws and its batch-only queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class QoaConfig(CLConfig):
    method: ClassVar[str] = "qoa"

    buffer_size: int = field(
        default=2000,
        metadata={"help": "Capacity of the reservoir replay buffer of (features, label) the support set is drawn "
                          "from."},
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
        metadata={"help": "'softmax' over the support set (convex combination of labels) or 'mean' "
                          "(raw scores / |S|)."},
    )
    probability_floor: float = field(
        default=1e-4,
        metadata={
            "help": "Mixed into softmax predictions as (1-eps) y_hat + eps/C so a class absent from the support "
            "has a finite log-probability."
        },
    )
    scorer: str = field(
        default="similarity",
        metadata={
            "help": "'similarity': cos(query, item) / temperature plus a zero-initialised residual MLP over "
            "[query; item; label; cosine] (untrained = cosine-similarity attention); 'mlp': the paper's MLP "
            "over [query; item; label] alone."
        },
    )
    temperature: float = field(
        default=0.03,
        metadata={"help": "Initial temperature of the cosine-similarity softmax (scorer='similarity'); "
                          "smaller = closer to 1-nearest-neighbour."},
    )
    learn_temperature: bool = field(
        default=True,
        metadata={"help": "Train the temperature (as a log-temperature) with the residual (scorer='similarity')."},
    )
    learn_residual: bool = field(
        default=True,
        metadata={"help": "Add the residual MLP to the similarity scores (scorer='similarity'); False = a fixed "
                          "(or temperature-only) cosine-similarity attention classifier."},
    )
    residual_reads_label: bool = field(
        default=True,
        metadata={"help": "Give the residual MLP the item's one-hot label (scorer='similarity'); False = a "
                          "label-blind residual, which cannot learn a per-class preference such as recency."},
    )
    batch_queries: bool = field(
        default=True,
        metadata={"help": "QOA head: the current batch is a training query set too (its loss is the 'ce' term); "
                          "False = only the replayed buffer queries train the scorer (the batch still enters the "
                          "buffer)."},
    )
    support_per_class: int = field(
        default=100,
        metadata={
            "help": "QOA head: items of each class in the buffer that form the support set, drawn without "
            "replacement (all of a class that has fewer), the same size in training and evaluation; "
            "0 = the uniform support_size / eval_support_size draws."
        },
    )
    replay_queries: int = field(
        default=128,
        metadata={
            "help": "QOA head: buffer items used as extra training queries each step, each excluded from its own "
            "support set; every query (batch or buffer) weighs the same in the loss; 0 = the current batch only."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the support-set sampling and the scorer's initialisation."})

    TASKS: ClassVar[tuple[str, ...]] = ("classification", "regression")
    NORMALIZATIONS: ClassVar[tuple[str, ...]] = ("softmax", "mean")
    SCORERS: ClassVar[tuple[str, ...]] = ("similarity", "mlp")

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
        if self.scorer not in self.SCORERS:
            raise ValueError(f"QoaConfig.scorer must be one of {self.SCORERS}, got {self.scorer!r}")
        if self.scorer == "similarity" and self.score_normalization != "softmax":
            raise ValueError("QoaConfig.score_normalization must be 'softmax' with scorer='similarity' "
                             f"(a cosine-similarity attention classifier), got {self.score_normalization!r}")
        self._check_positive("temperature")
        for name in ("learn_temperature", "learn_residual", "residual_reads_label", "batch_queries"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"QoaConfig.{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("support_per_class", "replay_queries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"QoaConfig.{name} must be an int >= 0, got {value!r}")
        if not 0.0 <= self.probability_floor < 1.0:
            raise ValueError(f"QoaConfig.probability_floor must be in [0, 1), got {self.probability_floor!r}")
        if not self.freeze_backbone:
            raise ValueError("QoaConfig.freeze_backbone must be True: the buffer stores fixed backbone features")

    @property
    def label_dim(self) -> int:
        """Width of the label vectors the scorer reads and the prediction combines."""
        return self.max_classes if self.task == "classification" else self.target_dim
