"""What a continual method plugs into.

A method is an ``nn.Module`` that owns the modules it adds to a backbone and
implements a handful of hooks the engine calls. Everything else (freezing,
the incremental head, saving, loading, Accelerate, evaluation) is shared and
lives in ``hf_clroute.model`` and ``hf_clroute.engine``.

Hook order per experience (task):
``on_task_start`` -> for each batch: ``logits`` -> ``loss`` + ``extra_losses``
-> backward/step -> ``after_step`` (and ``before_evaluation`` before every
evaluation) -> ``on_task_end``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..config import CLConfig
from ..heads import task_mask_logits

if TYPE_CHECKING:  # pragma: no cover
    from accelerate import Accelerator
    from datasets import IterableDataset

    from ..data.streams import Experience
    from ..model import CLModel


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Draw a module's initial weights from ``seed`` without moving the global RNG stream,
    so adding a method never changes the data order or dropout of the rest of the run."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@dataclass
class StepContext:
    """What the engine tells a hook about where the stream is."""

    accelerator: "Accelerator | None"
    task_id: int
    step_in_task: int = 0
    global_step: int = 0
    epochs: int = 1


class ContinualMethod(nn.Module):
    """Base class: a method that adds nothing (the backbone + incremental head as is)."""

    config_class: type[CLConfig] = CLConfig
    #: "online" (each sample once) and/or "offline" (several epochs per task).
    supported_modes: tuple[str, ...] = ("online", "offline")
    #: modalities the method can work with ("image", "text", "lm").
    supported_modalities: tuple[str, ...] = ("image", "text")
    #: appended to the error when the backbone's modality is unsupported (e.g. "use vpt").
    unsupported_hint: str = ""
    #: whether the shared incremental linear head produces the logits.
    uses_head: bool = True
    #: True when the method only reads the frozen backbone's pooled features (no change
    #: inside the backbone): the bench may then feed cached features instead of inputs.
    reads_frozen_features: bool = False

    def __init__(self, config: CLConfig) -> None:
        super().__init__()
        self.config = config
        self.task_classes: list[int] = []  # the current experience's classes (set by begin_task)

    # ---- structure -------------------------------------------------------------
    def attach(self, model: "CLModel") -> None:
        """Add this method's modules to ``model`` (the backbone is already frozen if asked)."""

    # ---- forward ---------------------------------------------------------------
    def features(self, model: "CLModel", inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.extract_features(inputs)

    def logits(self, model: "CLModel", inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.head(self.features(model, inputs))

    def loss(self, model: "CLModel", batch: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        labels = batch["labels"]
        if self.config.current_task_loss and self.config.scenario == "class" and len(self.task_classes) > 1:
            # Earlier classes leave the softmax (unless in the batch, e.g. replayed), so their head
            # rows get no push-down from new samples: the recency bias of a shared class-IL head.
            # A one-class task keeps every class (a one-logit softmax has no gradient).
            logits = task_mask_logits(logits, sorted(set(self.task_classes) | set(labels.tolist())))
        return F.cross_entropy(logits, labels)

    def extra_losses(
        self, model: "CLModel", batch: dict[str, torch.Tensor], logits: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Named auxiliary terms added to the loss (regularisers, distillation, load balance)."""
        return {}

    # ---- data ------------------------------------------------------------------
    def training_stream(
        self, experience: "Experience", seen: list["Experience"], epochs: int
    ) -> "IterableDataset":
        """The data trained on for ``experience`` (``seen`` = experiences so far, itself last).

        Default: the experience's own stream, read once (online) or ``epochs`` times.
        An upper-bound baseline may return more (e.g. all data seen so far).
        """
        return experience.train_stream(epochs=epochs)

    # ---- hooks -----------------------------------------------------------------
    def begin_task(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        """What the engine calls at an experience's start: records its classes, then ``on_task_start``."""
        self.task_classes = list(experience.classes)
        self.on_task_start(model, experience, ctx)

    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        """Called before the first batch of an experience (the head has already grown)."""

    def after_step(
        self, model: "CLModel", batch: dict[str, torch.Tensor], logits: torch.Tensor, ctx: StepContext
    ) -> None:
        """Called after every optimiser step (or every batch, for methods with nothing to train)."""

    def before_evaluation(self, model: "CLModel", ctx: StepContext) -> None:
        """Called before every evaluation, e.g. to synchronise statistics across processes."""

    def on_task_end(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        """Called after the last batch of an experience."""

    def curves(self) -> dict[str, list[list[float]]]:
        """Method-specific series over the stream for plots, ``{name: [[step, value], ...]}``.

        Default: any ``*_history`` entry of :meth:`extra_state` (e.g. a slot count).
        """
        return {k: v for k, v in self.extra_state().items() if k.endswith("_history")}

    # ---- state that is not a tensor ---------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """JSON-serialisable state saved with the adapter (counters, sizes of grown modules)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`; called *before* tensors load, so modules can be resized."""
