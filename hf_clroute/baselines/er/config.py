"""``ERConfig``: the settings of experience replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class ERConfig(CLConfig):
    method: ClassVar[str] = "er"

    freeze_backbone: bool = field(
        default=False, metadata={"help": "False: train backbone + head as naive fine-tuning does, plus replay."}
    )
    buffer_size: int = field(
        default=500, metadata={"help": "Examples kept in the reservoir buffer (all tasks together)."}
    )
    replay_weight: float = field(default=1.0, metadata={"help": "Weight of the replayed batch's cross-entropy."})
    max_length: int = field(
        default=128, metadata={"help": "Token length text inputs are stored at (longer batches are refused)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the reservoir decisions and of the replay draws."})

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("buffer_size", "max_length")
        if self.replay_weight < 0:
            raise ValueError(f"ERConfig.replay_weight must be >= 0, got {self.replay_weight!r}")
