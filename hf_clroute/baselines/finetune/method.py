"""Naive fine-tuning: train the whole backbone and head on each task in turn.

The lower bound of every continual benchmark: nothing protects old tasks, so it
shows how much a method actually prevents forgetting. ``last_blocks=1`` trains only the
backbone's last transformer block (and the head): the positive control of first-session
adaptation (``lastblock-fsa-ranpac``), the module with the most capacity to move the features.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.baselines.finetune.config import FinetuneConfig
from hf_clroute.core.method import ContinualMethod

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


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
