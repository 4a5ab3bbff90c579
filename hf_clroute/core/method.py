"""What a continual method plugs into.

A method is an ``nn.Module`` that owns the modules it adds to a backbone and
implements a handful of hooks the engine calls. Everything else (freezing,
the incremental head, saving, loading, Accelerate, evaluation) is shared and
lives in ``hf_clroute.core.model`` and ``hf_clroute.engine``.

Hook order per experience (task):
``on_task_start`` -> for each batch: ``forward`` (``features`` -> ``classify`` ->
``loss`` + ``extra_losses``, all inside the one model call, so the whole graph
runs under DDP) -> backward/step -> ``after_step`` (and ``before_evaluation``
before every evaluation) -> ``on_task_end``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.core.config import CLConfig
from hf_clroute.core.outputs import CLModelOutput, model_inputs
from hf_clroute.core.replay_buffer import ReservoirBuffer
from hf_clroute.heads import StatisticsHead, task_mask_logits

if TYPE_CHECKING:  # pragma: no cover
    from datasets import IterableDataset
    from peft import PeftConfig

    from hf_clroute.data.experiences import Experience


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Draw a module's initial weights from ``seed`` without moving the global RNG stream,
    so adding a method never changes the data order or dropout of the rest of the run."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@dataclass
class StepContext:
    """What the engine tells a hook: where the stream is, and how to combine tensors
    across processes without touching the Accelerator (one process: both are identity).

    ``reduce(t)`` sums ``t`` over processes; ``gather(t)`` concatenates every process's
    ``t`` along dim 0 in process order, dropping the samples duplicated to even out a
    last batch, so a hook sees exactly the global batch one process would have seen.
    Both are collectives: every process must call them together.
    """

    task_id: int
    step_in_task: int = 0
    global_step: int = 0
    epochs: int = 1
    process_index: int = 0
    num_processes: int = 1
    _reduce: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)
    _gather: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)

    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._reduce is None or self.num_processes == 1:
            return tensor
        return self._reduce(tensor).to(tensor.device)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._gather is None or self.num_processes == 1:
            return tensor
        return self._gather(tensor.contiguous())


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
    #: whether first-session adaptation (``engine/first_session.py``) calls this method's ``begin_task``,
    #: ``after_step`` and ``on_task_end`` around its phase, as for one task trained with the temporary
    #: linear head. Off by default: most methods need no per-step state to train their adapter, and
    #: their bookkeeping (e.g. APN's patch usage) would otherwise count the phase as part of task 0.
    hooks_during_adaptation: bool = False
    #: summary metrics this method's accuracy matrix cannot give (reported as n/a), e.g. joint training's
    #: final form, whose rows before the last task score an untrained model.
    undefined_metrics: tuple[str, ...] = ()
    #: True when the method trains once, at the last task, on one stream read ``epochs`` times in the same
    #: order: its e-epoch run is then the first e epochs of its E-epoch run, and ``hf-clroute tune`` scores
    #: both from one run (joint training's final form).
    epochs_share_prefix: bool = False

    def __init__(self, config: CLConfig) -> None:
        super().__init__()
        self.config = config
        self.task_classes: list[int] = []  # the current experience's classes (set by begin_task)

    # ---- structure -------------------------------------------------------------
    def attach(self, model: nn.Module) -> None:
        """Add this method's modules to ``model`` (the backbone is already frozen if asked)."""

    def check_stream(self, n_tasks: int) -> None:
        """Refuse, before anything trains, a stream of ``n_tasks`` more experiences than this
        method can hold (raise ``UserInputError`` naming the config field)."""

    # ---- forward ---------------------------------------------------------------
    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> CLModelOutput:
        """One model call: logits, and when the batch has ``labels`` the loss with its named terms."""
        inputs = model_inputs(batch)
        if model.spec.modality == "lm":
            return self.with_loss(model, batch, CLModelOutput(logits=model.backbone(**inputs).logits))
        features = self.features(model, inputs)
        out = CLModelOutput(logits=self.classify(model, features), features=features.detach())
        return self.with_loss(model, batch, out)

    def features(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """What the classifier reads: the backbone's pooled features by default."""
        return model.extract_features(inputs)

    def classify(self, model: nn.Module, features: torch.Tensor) -> torch.Tensor:
        return model.head(features)

    def with_loss(self, model: nn.Module, batch: dict[str, torch.Tensor], out: CLModelOutput) -> CLModelOutput:
        """``out`` with ``loss``/``losses`` filled in when the batch is labelled (training)."""
        if "labels" not in batch:
            return out
        if self.config.scenario == "task" and model.spec.modality != "lm":
            out.logits = task_mask_logits(out.logits, self.task_classes)  # task id known: its classes only
        losses = {"ce": self.loss(model, batch, out.logits), **self.extra_losses(model, batch, out.logits)}
        out.losses, out.loss = losses, sum(losses.values())
        return out

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        labels = batch["labels"]
        if model.spec.modality == "lm":
            return language_model_loss(model, logits, labels, self.config.current_task_loss)
        if self.config.current_task_loss and self.config.scenario == "class" and len(self.task_classes) > 1:
            # Earlier classes leave the softmax (unless in the batch, e.g. replayed), so their head
            # rows get no push-down from new samples: the recency bias of a shared class-IL head.
            # A one-class task keeps every class (a one-logit softmax has no gradient).
            logits = task_mask_logits(logits, sorted(set(self.task_classes) | set(labels.tolist())))
        if isinstance(model.head, StatisticsHead):
            return cross_entropy_over_scored(logits, labels)
        return F.cross_entropy(logits, labels)

    def extra_losses(
        self, model: nn.Module, batch: dict[str, torch.Tensor], logits: torch.Tensor
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

    def training_examples(self, experience: "Experience", seen: list["Experience"], epochs: int) -> int:
        """How many examples :meth:`training_stream` yields (a stream has no length): the trainer spreads
        the task's anytime evaluations over them. Override it with ``training_stream``."""
        return len(experience.train) * epochs

    # ---- hooks -----------------------------------------------------------------
    def begin_task(self, model: nn.Module, experience: "Experience", ctx: StepContext) -> None:
        """What the engine calls at an experience's start: records its classes, then ``on_task_start``."""
        self.task_classes = list(experience.classes)
        self.on_task_start(model, experience, ctx)

    def on_task_start(self, model: nn.Module, experience: "Experience", ctx: StepContext) -> None:
        """Called before the first batch of an experience (the head has already grown)."""

    def after_step(
        self, model: nn.Module, batch: dict[str, torch.Tensor], out: CLModelOutput, ctx: StepContext
    ) -> None:
        """Called after every optimiser step (or every batch, for methods with nothing to train)
        with that step's output (detached ``features``, ``extras``)."""

    def before_evaluation(self, model: nn.Module, ctx: StepContext) -> None:
        """Called before every evaluation, e.g. to synchronise statistics across processes."""

    def on_task_end(self, model: nn.Module, experience: "Experience", ctx: StepContext) -> None:
        """Called after the last batch of an experience."""

    # ---- state that is not a tensor ---------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """JSON-serialisable state saved with the adapter (counters, sizes of grown modules)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`; called *before* tensors load, so modules can be resized."""

    def peft_adapter(self, model: nn.Module) -> "tuple[PeftConfig, dict[str, str]] | None":
        """For a method that is PEFT's own (LoRA, prompt tuning): PEFT's config of the adapter and
        the names PEFT gives its tensors (our state-dict key -> PEFT's key), so the adapter is saved
        in PEFT's format (``CLModel.save_pretrained``). None, the default: hf_clroute's format."""
        return None


def add_global_batch(buffer: Any, features: torch.Tensor, labels: torch.Tensor, ctx: StepContext) -> None:
    """Add a step's (features, labels) to a feature buffer: every process adds the whole global
    batch, in order, so the processes' buffers (and their reservoir draws) stay identical."""
    buffer.add({"features": ctx.gather(features).float(), "labels": ctx.gather(labels).long()})


class FeatureMemoryMethod(ContinualMethod):
    """A method that classifies from a reservoir buffer of (frozen features, label), filled after
    every step with the global batch. QOA and its k-NN control share this memory: with the same
    ``buffer_size`` and ``seed`` on the same stream they hold the same items. The config needs
    ``buffer_size`` and ``seed``; ``num_classes`` counts the classes seen so far."""

    uses_head = False

    def __init__(self, config: CLConfig) -> None:
        super().__init__(config)
        self.buffer = ReservoirBuffer(config.buffer_size, seed=config.seed)
        self.num_classes = 0

    def on_task_start(self, model: nn.Module, experience: "Experience", ctx: StepContext) -> None:
        if experience.classes:
            self.num_classes = max(self.num_classes, max(experience.classes) + 1)

    def after_step(self, model: nn.Module, batch: dict[str, torch.Tensor], out, ctx: StepContext) -> None:
        add_global_batch(self.buffer, out.features, batch["labels"], ctx)

    def extra_state(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "buffer": self.buffer.extra_state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.num_classes = int(state.get("num_classes", 0))
        self.buffer.load_extra_state(state.get("buffer", {}))


def cross_entropy_over_scored(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the samples whose own class has a finite logit.

    A statistics head scores a class with no examples yet as ``-inf`` (its statistics
    fold in at the next sync, so on a task's first batches its new classes have none):
    plain cross-entropy would be ``inf`` there and its gradient NaN. Such samples are
    left out; a batch of only such samples gives a zero loss with a zero gradient.
    No device sync: the mask is applied with ``where``, not by indexing.
    """
    scored = torch.isfinite(logits.gather(1, labels.unsqueeze(1))).squeeze(1)
    safe = torch.where(scored.unsqueeze(1), logits, torch.zeros_like(logits))
    per_sample = F.cross_entropy(safe, labels, reduction="none")
    return torch.where(scored, per_sample, torch.zeros_like(per_sample)).sum() / scored.sum().clamp(min=1)


def language_model_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor,
                        current_task: bool) -> torch.Tensor:
    """Next-token cross-entropy (labels -100 are ignored), as the backbone's own loss computes it.

    ``current_task``: the softmax covers only the tokens this batch predicts, the language-model
    form of a current-task loss (tokens the batch never uses get no push-down).
    """
    if not current_task:
        return model.backbone.loss_function(logits=logits, labels=labels, vocab_size=model.backbone.config.vocab_size)
    shifted, targets = logits[:, :-1].float(), labels[:, 1:]
    present = torch.unique(targets[targets != -100])
    masked = shifted.new_full((shifted.shape[-1],), float("-inf")).index_fill_(0, present, 0.0)
    return F.cross_entropy((shifted + masked).transpose(1, 2), targets, ignore_index=-100)


def freeze_all_but(model: nn.Module, keep: Iterable[nn.Module | None]) -> list[nn.Parameter]:
    """Stop training every parameter of ``model`` outside ``keep``; returns them for :func:`unfreeze`.

    Used for the "FFN only" adaptation; :func:`unfreeze` runs at the task's end, so a
    model saved between tasks still holds (and saves) every weight trained on task 0.
    """
    kept = {id(p) for module in keep if module is not None for p in module.parameters()}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in kept]
    for param in frozen:
        param.requires_grad_(False)
    return frozen


def unfreeze(params: list[nn.Parameter]) -> None:
    for param in params:
        param.requires_grad_(True)
