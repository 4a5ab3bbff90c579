"""``RanPACConfig``: the settings of RanPAC's closed-form head on frozen features."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hf_clroute.baselines.class_statistics.config import FrozenStatisticsConfig


@dataclass
class RanPACConfig(FrozenStatisticsConfig):
    method: ClassVar[str] = "ranpac"
    head_kind: ClassVar[str] = "ranpac"

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
