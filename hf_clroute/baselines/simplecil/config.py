"""``SimpleCILConfig``: the settings of SimpleCIL, nearest class mean on frozen features."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hf_clroute.baselines.class_statistics.config import FrozenStatisticsConfig


@dataclass
class SimpleCILConfig(FrozenStatisticsConfig):
    method: ClassVar[str] = "simplecil"
    head_kind: ClassVar[str] = "prototype"

    head: str = field(
        default="prototype",
        metadata={"help": "Always 'prototype': one class mean per class (nearest class mean)."},
    )
    head_options: dict[str, Any] = field(
        default_factory=lambda: {"metric": "cosine"},
        metadata={"help": "Prototype head options: {'metric': 'cosine'} (SimpleCIL) or {'metric': 'euclidean'}."},
    )
