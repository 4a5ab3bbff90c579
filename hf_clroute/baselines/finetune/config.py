"""``FinetuneConfig``: the settings of naive fine-tuning (optionally of the last blocks only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class FinetuneConfig(CLConfig):
    method: ClassVar[str] = "finetune"

    freeze_backbone: bool = field(
        default=False,
        metadata={"help": "False trains every backbone weight (naive fine-tuning); True trains the head only."},
    )
    last_blocks: int = field(
        default=0,
        metadata={"help": "Train only the backbone's last N transformer blocks (and the head); 0 = every backbone "
                          "weight. Needs freeze_backbone=False: the trained blocks are backbone weights, and the "
                          "adapter saves the backbone's weights whole."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.last_blocks, bool) or not isinstance(self.last_blocks, int) or self.last_blocks < 0:
            raise ValueError(f"{type(self).__name__}.last_blocks must be an integer >= 0, got {self.last_blocks!r}")
        if self.last_blocks and self.freeze_backbone:
            raise ValueError(f"{type(self).__name__}.last_blocks needs freeze_backbone=False (the blocks it trains "
                             "are backbone weights)")
