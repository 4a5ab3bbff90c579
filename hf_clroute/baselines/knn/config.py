"""``KNNConfig``: the settings of cosine k-nearest neighbours."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class KNNConfig(CLConfig):
    method: ClassVar[str] = "knn"

    buffer_size: int = field(
        default=2000,
        metadata={"help": "Capacity of the reservoir buffer of (features, label); QOA's buffer_size for its control."},
    )
    k: int = field(
        default=10,
        metadata={"help": "Neighbours that vote (fewer while the buffer holds fewer items)."},
    )
    seed: int = field(
        default=0,
        metadata={"help": "Seed of the reservoir's keep/replace decisions (as QOA's seed: the same buffer contents)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("buffer_size", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"KNNConfig.{name} must be a positive integer, got {value!r}")
        if not self.freeze_backbone:
            raise ValueError("KNNConfig.freeze_backbone must be True: the buffer stores fixed backbone features")
