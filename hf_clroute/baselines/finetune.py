"""Naive fine-tuning: train the whole backbone and head on each task in turn.

The lower bound of every continual benchmark: nothing protects old tasks, so it
shows how much a method actually prevents forgetting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import CLConfig
from ..methods.base import ContinualMethod


@dataclass
class FinetuneConfig(CLConfig):
    method = "finetune"

    freeze_backbone: bool = field(
        default=False,
        metadata={"help": "False trains every backbone weight (naive fine-tuning); True trains the head only."},
    )


class Finetune(ContinualMethod):
    """The base class already does it all: backbone (unfrozen) + incremental head + CE."""

    config_class = FinetuneConfig
    supported_modalities = ("image", "text", "lm")
