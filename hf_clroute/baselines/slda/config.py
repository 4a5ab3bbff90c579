"""``SLDAConfig``: the settings of streaming LDA on frozen features."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hf_clroute.baselines.class_statistics.config import FrozenStatisticsConfig


@dataclass
class SLDAConfig(FrozenStatisticsConfig):
    method: ClassVar[str] = "slda"
    head_kind: ClassVar[str] = "lda"

    head: str = field(
        default="lda",
        metadata={"help": "Always 'lda': class means and one shared covariance, updated in one streaming pass."},
    )
    head_options: dict[str, Any] = field(
        default_factory=lambda: {"shrinkage": 1e-4},
        metadata={
            "help": "Streaming-LDA head options: {'shrinkage': s}, the share of the covariance replaced by "
            "(its mean variance) x identity, in [0, 1] (1e-4, as streaming LDA uses; 1 = nearest mean)."
        },
    )
