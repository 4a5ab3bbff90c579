"""``JointConfig``: the settings of joint training (the upper bound)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class JointConfig(CLConfig):
    method: ClassVar[str] = "joint"

    freeze_backbone: bool = field(
        default=False, metadata={"help": "False trains the backbone and head, as naive fine-tuning does."}
    )
    schedule: str = field(
        default="cumulative",
        metadata={"help": "'cumulative': at task t train on the union of tasks 0..t (every boundary row is an upper "
                          "bound). 'final': train only at the last task, on the union of every task (the offline upper "
                          "bound; only A_T is defined)."},
    )
    shuffle_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the shuffle of the union; None = the run's seed (TrainingConfig.seed)."},
    )


    SCHEDULES = ("cumulative", "final")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.schedule not in self.SCHEDULES:
            raise ValueError(f"JointConfig.schedule must be one of {self.SCHEDULES}, got {self.schedule!r}")
