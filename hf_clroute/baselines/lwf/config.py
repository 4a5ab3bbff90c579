"""``LwFConfig``: the settings of Learning without Forgetting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class LwFConfig(CLConfig):
    method: ClassVar[str] = "lwf"

    freeze_backbone: bool = field(
        default=False, metadata={"help": "False: train backbone + head as naive fine-tuning does, plus distillation."}
    )
    lwf_lambda: float = field(default=1.0, metadata={"help": "Weight of the distillation term."})
    temperature: float = field(default=2.0, metadata={"help": "Distillation temperature T."})

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("lwf_lambda", "temperature")
