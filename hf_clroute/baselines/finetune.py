"""Naive fine-tuning: train the whole backbone and head on each task in turn.

The lower bound of every continual benchmark: nothing protects old tasks, so it
shows how much a method actually prevents forgetting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from ..config import CLConfig
from ..backbones import get_blocks
from ..methods.base import ContinualMethod, StepContext, freeze_all_but, unfreeze

if TYPE_CHECKING:  # pragma: no cover
    from ..data.streams import Experience
    from ..model import CLModel


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


@dataclass
class FfnFinetuneConfig(FinetuneConfig):
    """Dense counterpart of APN's ``adapt_params='ffn'``: train everything on the first task,
    then only the blocks' FFNs (and the head). The char-LM suite's "dense, FFN-only" variant."""

    method = "finetune-ffn"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.freeze_backbone:
            raise ValueError("FfnFinetuneConfig.freeze_backbone must be False: the FFNs are backbone weights")


class FfnFinetune(Finetune):
    """Dense fine-tuning that, from the second task on, trains only each block's FFN (and the head)."""

    config_class = FfnFinetuneConfig

    def __init__(self, config: FfnFinetuneConfig) -> None:
        super().__init__(config)
        self._frozen: list[nn.Parameter] = []

    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        if ctx.task_id > 0:
            ffns = [block.get_submodule(p) for block in get_blocks(model.backbone) for p in model.spec.ffn]
            self._frozen = freeze_all_but(model, [*ffns, model.head])

    def on_task_end(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        unfreeze(self._frozen)
        self._frozen = []
