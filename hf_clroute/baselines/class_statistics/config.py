"""``FrozenStatisticsConfig``: the checks every class-statistics baseline shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hf_clroute.core.config import CLConfig


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
