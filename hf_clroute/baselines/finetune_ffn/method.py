"""Dense fine-tuning that, from the second task on, trains only each block's FFN (and the head).

The dense counterpart of APN's ``adapt_params="ffn"`` on the char-LM suites: the same
weights move, with no routing or patch banks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.baselines.finetune.method import Finetune
from hf_clroute.baselines.finetune_ffn.config import FfnFinetuneConfig
from hf_clroute.core.method import StepContext, freeze_all_but, unfreeze

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel
    from hf_clroute.data.experiences import Experience


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
