"""Naive fine-tuning: train the whole backbone and head on each task in turn.

The lower bound of every continual benchmark: nothing protects old tasks, so it
shows how much a method actually prevents forgetting. ``last_blocks=1`` trains only the
backbone's last transformer block (and the head): the positive control of first-session
adaptation (``lastblock-fsa-ranpac``), the module with the most capacity to move the features.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.core.config import CLConfig
from hf_clroute.methods.base import (
    ContinualMethod,
    StepContext,
    freeze_all_but,
    unfreeze,
)

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel
    from hf_clroute.data.experiences import Experience


@dataclass
class FinetuneConfig(CLConfig):
    method = "finetune"

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


class Finetune(ContinualMethod):
    """The base class already does it all: backbone (unfrozen) + incremental head + CE."""

    config_class = FinetuneConfig
    supported_modalities = ("image", "text", "lm")

    def attach(self, model: "CLModel") -> None:
        n = self.config.last_blocks
        if not n:
            return
        blocks = get_blocks(model.backbone)
        if n > len(blocks):
            raise ValueError(f"FinetuneConfig.last_blocks={n} but the backbone has {len(blocks)} blocks")
        model.backbone.requires_grad_(False)
        for block in blocks[-n:]:
            block.requires_grad_(True)


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
