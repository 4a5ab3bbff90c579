"""First-session adaptation: the settings, and the record of what an adaptation saw.

The step the strongest class-incremental methods on frozen pretrained backbones share
(APER / ADAM, RanPAC): before the stream, train a parameter-efficient module (LoRA, VPT,
RwF's routers, APN's patches, the last block) with a temporary linear head on the first
task (or on a labelled split carved from its training data), freeze it, then read the
whole stream with a closed-form statistics head on the adapted features. Any method whose
adapter trains accepts it through ``CLConfig.adaptation``; the engine runs the phase
(``hf_clroute.engine.first_session``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ADAPTATION_DATA = ("first_task", "adaptation_split")


@dataclass
class AdaptationConfig:
    """How the adapter is trained before the stream (``CLConfig.adaptation`` as a dict)."""

    on: str = field(
        default="first_task",
        metadata={"help": "The data the adapter trains on: 'first_task' (the first task's whole training stream, "
                          "which the statistics head then reads again, as APER and RanPAC do) or "
                          "'adaptation_split' (per_class examples of each first-task class, carved from its "
                          "training data and removed from the stream, so adaptation and stream are disjoint)."},
    )
    epochs: int = field(
        default=5,
        metadata={"help": "Passes over the adaptation data (read in its fixed stream order each pass)."},
    )
    learning_rate: float | None = field(
        default=None,
        metadata={"help": "Learning rate of the adaptation; None = TrainingConfig.learning_rate (so the "
                          "tuner's learning-rate grid applies to the adaptation)."},
    )
    batch_size: int | None = field(
        default=None, metadata={"help": "Global batch of the adaptation; None = TrainingConfig.batch_size."},
    )
    per_class: int | None = field(
        default=None,
        metadata={"help": "With on='adaptation_split': training examples of each first-task class carved "
                          "into the adaptation split (drawn by the run seed); each class must keep at least "
                          "one example for the stream. Must be None with on='first_task'."},
    )
    weight_decay: float = field(default=0.0, metadata={"help": "Weight decay of the adaptation's optimiser."})

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.on not in ADAPTATION_DATA:
            raise ValueError(f"{name}.on must be one of {ADAPTATION_DATA}, got {self.on!r}")
        for key, minimum in (("epochs", 1), ("batch_size", 1), ("per_class", 1)):
            value = getattr(self, key)
            if value is None and key != "epochs":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}.{key} must be an integer >= {minimum}, got {value!r}")
        if self.learning_rate is not None and (
                isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float))
                or self.learning_rate <= 0):
            raise ValueError(f"{name}.learning_rate must be a positive number or None, got {self.learning_rate!r}")
        decay = self.weight_decay
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or decay < 0:
            raise ValueError(f"{name}.weight_decay must be a number >= 0, got {self.weight_decay!r}")
        if self.on == "adaptation_split" and self.per_class is None:
            raise ValueError(f"{name}.per_class is required with on='adaptation_split' (examples per class to carve)")
        if self.on == "first_task" and self.per_class is not None:
            raise ValueError(
                f"{name}.per_class applies only to on='adaptation_split'; leave it None with on='first_task'")

    @classmethod
    def from_value(cls, value: Any, owner: str) -> "AdaptationConfig":
        """``value`` (a dict of fields, or an AdaptationConfig) validated; errors name ``owner``'s field."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{owner}.adaptation must be a dict of AdaptationConfig fields or None, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{owner}.adaptation has unknown field(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**value)
        except ValueError as err:
            raise ValueError(f"{owner}.adaptation: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe_record(record: dict[str, Any] | None) -> str:
    """One sentence on what an adaptation saw (for model cards); "" when there was none."""
    if not record:
        return ""
    data = ("the whole training data of" if record.get("on") == "first_task"
            else "a split carved from the training data (disjoint from the stream) of")
    classes = ", ".join(str(c) for c in record.get("classes", []))
    return (f"First-session adaptation: {record.get('examples')} examples, {record.get('epochs')} epoch(s), "
            f"{data} task `{record.get('task')}` (classes: {classes}); the adapter was frozen afterwards.")
