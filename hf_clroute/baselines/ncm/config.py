"""``NCMConfig``: the settings of nearest class mean, ``simplecil`` with the metric as its own field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hf_clroute.baselines.simplecil.config import SimpleCILConfig
from hf_clroute.heads.prototype import METRICS


@dataclass
class NCMConfig(SimpleCILConfig):
    """``simplecil`` under its older name; ``metric`` sets the prototype head's metric."""

    method: ClassVar[str] = "ncm"

    metric: str = field(
        default="cosine",
        metadata={"help": "'cosine' similarity or negative 'euclidean' distance to each class mean."},
    )
    head_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "Prototype head options; 'metric' is taken from the metric field."},
    )

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"NCMConfig.metric must be one of {METRICS}, got {self.metric!r}")
        if isinstance(self.head_options, dict):
            given = self.head_options.get("metric", self.metric)
            if given != self.metric:
                raise ValueError(
                    f"NCMConfig.metric is {self.metric!r} but head_options['metric'] is {given!r}; set one of them"
                )
            self.head_options = {**self.head_options, "metric": self.metric}
        super().__post_init__()
