"""Frozen backbone + a closed-form statistics head: nothing is trained.

Each baseline is the base method with the backbone frozen and ``head`` set to a
statistics head (``hf_clroute.heads``): the model adds every training batch's
features to the head's class statistics and re-solves the head before every
evaluation. No parameter has a gradient, so the engine only runs the forward
passes. Sums commute, so the result does not depend on the order of the stream,
on the batch size or on the number of processes (up to float rounding); how good
each one is says how good the frozen features are for that classifier.

* ``simplecil``: one prototype per class (the mean feature), cosine similarity:
  SimpleCIL (Zhou et al. 2023) on a frozen backbone, i.e. nearest class mean.
* ``slda``: streaming LDA (Hayes & Kanan 2020): class means and one shared,
  shrunk covariance.
* ``ranpac``: RanPAC's closed-form head (McDonnell et al. 2023): a fixed random
  ReLU projection of the features, then ridge regression to one-hot targets.
* ``ncm``: the older name of ``simplecil``, with the metric as its own field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hf_clroute.core.config import CLConfig
from hf_clroute.heads.prototype import METRICS
from hf_clroute.methods.base import ContinualMethod


@dataclass
class FrozenStatisticsConfig(CLConfig):
    """Shared checks: the backbone stays frozen and the head is the baseline's own kind."""

    #: the one head kind the baseline is defined by.
    head_kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.head != self.head_kind:
            raise ValueError(
                f"{name}.head must be {self.head_kind!r} (the {self.method} baseline is that head); "
                f"set head={self.head!r} on another method (e.g. finetune with freeze_backbone=True) instead"
            )
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError(f"{name}.freeze_backbone must be True: class statistics need fixed features")


@dataclass
class SimpleCILConfig(FrozenStatisticsConfig):
    method = "simplecil"
    head_kind = "prototype"

    head: str = field(
        default="prototype",
        metadata={"help": "Always 'prototype': one class mean per class (nearest class mean)."},
    )
    head_options: dict[str, Any] = field(
        default_factory=lambda: {"metric": "cosine"},
        metadata={"help": "Prototype head options: {'metric': 'cosine'} (SimpleCIL) or {'metric': 'euclidean'}."},
    )


@dataclass
class SLDAConfig(FrozenStatisticsConfig):
    method = "slda"
    head_kind = "lda"

    head: str = field(
        default="lda",
        metadata={"help": "Always 'lda': class means and one shared covariance, updated in one streaming pass."},
    )
    head_options: dict[str, Any] = field(
        default_factory=lambda: {"shrinkage": 1e-4},
        metadata={
            "help": "Streaming-LDA head options: {'shrinkage': s}, the share of the covariance replaced by "
            "(its mean variance) x identity, in [0, 1] (1e-4, as streaming LDA uses; 1 = nearest mean)."
        },
    )


@dataclass
class RanPACConfig(FrozenStatisticsConfig):
    method = "ranpac"
    head_kind = "ranpac"

    head: str = field(
        default="ranpac",
        metadata={"help": "Always 'ranpac': a fixed random projection then a ridge-regression readout."},
    )
    head_options: dict[str, Any] = field(
        default_factory=lambda: {"projection_dim": 2048, "ridge_lambda": 1.0, "nonlinearity": "relu"},
        metadata={
            "help": "RanPAC head options: 'projection_dim' M (the Gram matrix is M x M float64), 'ridge_lambda' "
            "(> 0), 'nonlinearity' ('relu' or 'none') and 'lambda_mode': 'fixed' (lambda = ridge_lambda), "
            "'relative' (lambda = ridge_lambda x trace(G) / M, the same grid on every backbone) or 'gcv' (chosen "
            "at every solve by generalized cross-validation, RanPAC's own choice on training data), and "
            "'gcv_min_classes' (default 5): below that many classes seen, 'gcv' solves with the relative "
            "ridge_lambda, since GCV on one or two classes picks a lambda that breaks the early tasks. The "
            "projection's seed is head_init_seed."
        },
    )


@dataclass
class NCMConfig(SimpleCILConfig):
    """``simplecil`` under its older name; ``metric`` sets the prototype head's metric."""

    method = "ncm"

    metric: str = field(
        default="cosine",
        metadata={"help": "'cosine' similarity or negative 'euclidean' distance to each class mean."},
    )
    head_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "Prototype head options; 'metric' is taken from the metric field."},
    )

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"NCMConfig.metric must be one of {METRICS}, got {self.metric!r}")
        if isinstance(self.head_options, dict):
            given = self.head_options.get("metric", self.metric)
            if given != self.metric:
                raise ValueError(
                    f"NCMConfig.metric is {self.metric!r} but head_options['metric'] is {given!r}; set one of them"
                )
            self.head_options = {**self.head_options, "metric": self.metric}
        super().__post_init__()


class FrozenStatisticsBaseline(ContinualMethod):
    """The base method on a frozen backbone: the model feeds and solves the statistics head."""

    config_class = FrozenStatisticsConfig


class SimpleCIL(FrozenStatisticsBaseline):
    """Nearest class mean (cosine) on frozen features: SimpleCIL, with no adaptation stage."""

    config_class = SimpleCILConfig


class NearestClassMean(SimpleCIL):
    """Nearest class mean on frozen features (``simplecil`` under its older name)."""

    config_class = NCMConfig


class StreamingLDA(FrozenStatisticsBaseline):
    """Streaming LDA on frozen features: class means, one shared shrunk covariance."""

    config_class = SLDAConfig


class RanPAC(FrozenStatisticsBaseline):
    """RanPAC's closed-form head on frozen features: random ReLU projection + ridge regression."""

    config_class = RanPACConfig
