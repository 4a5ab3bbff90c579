"""What one model call returns, and the one place a batch's inputs are told from its labels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

#: Batch keys a backbone takes; everything else (labels, cached ``features``) is ours.
BACKBONE_INPUTS = ("pixel_values", "input_ids", "attention_mask", "token_type_ids")


@dataclass
class CLModelOutput(ModelOutput):
    """One forward pass of a :class:`~hf_clroute.core.model.CLModel`.

    ``loss`` is set when the batch has ``labels``: the method's own loss plus every
    named auxiliary term in ``losses`` (so ``loss == sum(losses.values())``).
    ``features`` are what the classifier read (detached), for statistics heads,
    buffers and probes; ``extras`` hold per-step records a method's ``after_step``
    needs (MaRS's routing statistics), so nothing is kept on the method between calls.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    losses: dict[str, torch.Tensor] | None = None
    features: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] | None = None


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch without its labels: what a model is called with for prediction."""
    return {k: v for k, v in batch.items() if k != "labels"}


def backbone_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Only the keys the backbone itself accepts."""
    return {k: v for k, v in batch.items() if k in BACKBONE_INPUTS}
