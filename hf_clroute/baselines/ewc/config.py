"""``EWCConfig``: the settings of online EWC."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class EWCConfig(CLConfig):
    method: ClassVar[str] = "ewc"

    freeze_backbone: bool = field(
        default=False, metadata={"help": "False: train backbone + head as naive fine-tuning does, plus the penalty."}
    )
    ewc_lambda: float = field(
        default=100.0, metadata={"help": "Penalty weight lambda in lambda/2 * sum F (theta - theta*)^2."}
    )
    gamma: float = field(
        default=0.9, metadata={"help": "Decay of the running Fisher at each task end (1.0 = plain sum)."}
    )
    fisher_samples: int = field(
        default=200, metadata={"help": "Examples per task (per process) the Fisher is estimated on."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("ewc_lambda", "fisher_samples")
        self._check_fraction("gamma")
