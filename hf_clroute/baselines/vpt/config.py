"""``VPTConfig``: the settings of visual prompt tuning (VPT-shallow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class VPTConfig(CLConfig):
    method: ClassVar[str] = "vpt"

    num_prompts: int = field(default=10, metadata={"help": "Learned prompt tokens inserted after the CLS token."})

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("num_prompts")
        if not self.freeze_backbone:
            raise ValueError("VPTConfig.freeze_backbone must be True: VPT trains only the prompts (and head)")
