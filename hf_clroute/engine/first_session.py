"""The adaptation phase before the stream, and statistics read again when an adapter freezes.

:func:`prepare_adaptation` runs first-session adaptation (``CLConfig.adaptation``, see
:mod:`hf_clroute.core.first_session_config`) inside ``ContinualTrainer.fit``, after the untrained accuracy b_j
is measured (b_j is the model before any training; the adaptation trains on the first task) and before task 0:

1. ``adaptation_split``: ``per_class`` training examples of each first-task class, drawn by the run seed,
   are carved out of experience 0's training data; the stream trains on the rest. Validation and test are
   separate splits already, so the adaptation data are disjoint from stream, validation and test. The carve
   is made here rather than when the stream is built, so any suite and any stream can use it with the
   method's setting alone.
2. The method's adapter (every trainable parameter outside the head) trains with a temporary linear head
   over the first task's classes, ``epochs`` passes with Accelerate (the model and optimiser prepared; one
   model call and ``accelerator.backward`` per step). The method's statistics head is swapped out for the
   phase and comes back empty. A method whose training needs its own per-step state (MaRS: slot keys
   seeded from the first queries, the DCDA stage schedule, SGSE) sets ``hooks_during_adaptation``: the
   phase then calls its ``begin_task`` / ``after_step`` / ``on_task_end`` as for one task trained with the
   temporary head (the model's own hooks, label records and statistics head, are not called). Other
   methods get no hook, so their bookkeeping never counts the phase.
3. The adapter is frozen (``requires_grad`` False: no optimiser is built for it again and the
   statistics-only stream runs under ``no_grad``), and ``config.adaptation_record`` says what data it saw.
   The record is saved with the adapter: a reloaded or resumed model is frozen again here and never
   adapted twice. The stream then runs with nothing to train: the statistics head accumulates every
   task from step 0, in eval mode.

:func:`reaccumulate_statistics` handles the other way an adapter stops training: a method that trains its
adapter through a statistics head for a few tasks and then freezes it (RwF's ``train_routers_for_tasks``).
At the task end where nothing is left to train, the head's statistics (mixed from many adapter states) are
reset and the seen tasks' training streams are read again once, in eval mode, under the frozen adapter.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hf_clroute.core.method import StepContext
from hf_clroute.core.outputs import model_inputs
from hf_clroute.data.experiences import Experience
from hf_clroute.data.labeled import column_array
from hf_clroute.engine.batches import training_loader
from hf_clroute.engine.numerics import check_finite_state, check_step
from hf_clroute.engine.prepared import release_prepared
from hf_clroute.heads import IncrementalClassifier, StatisticsHead
from hf_clroute.runtime.progress import progress_bar

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

    from hf_clroute.core.first_session_config import AdaptationConfig
    from hf_clroute.core.model import CLModel

#: purpose id of the carve's random draw (independent of the stream's own draws)
_CARVE_PURPOSE = 24


def adapter_parameters(model: "CLModel") -> list[torch.nn.Parameter]:
    """Every trainable parameter of ``model`` outside its head: what the adaptation trains."""
    head = {id(p) for p in model.head.parameters()} if model.head is not None else set()
    return [p for p in model.trainable_parameters() if id(p) not in head]


def carve_adaptation_split(experience: Experience, per_class: int, seed: int) -> tuple["Dataset", Experience]:
    """(``per_class`` training examples of each of ``experience``'s classes, drawn by ``seed``,
    in dataset order; ``experience`` with the rest as its training data, in its stream order)."""
    train = experience.train
    if not hasattr(train, "select"):
        raise ValueError(f"adaptation on='adaptation_split' needs a map-style training split; task "
                         f"{experience.name!r} has an iterable one (use on='first_task')")
    labels = column_array(train)
    rng = np.random.default_rng([seed, _CARVE_PURPOSE])
    held = []
    for cls in experience.classes:
        members = np.flatnonzero(labels == cls)
        if len(members) <= per_class:
            raise ValueError(f"AdaptationConfig.per_class={per_class}: class {cls} of task {experience.name!r} has "
                             f"{len(members)} training examples, which leaves none for the stream")
        held.append(rng.choice(members, per_class, replace=False))
    held_idx = np.sort(np.concatenate(held))
    rest = np.setdiff1d(np.arange(len(train)), held_idx)  # sorted: the stream keeps its order
    return train.select(held_idx), dataclasses.replace(experience, train=train.select(rest))


def prepare_adaptation(trainer: Any) -> None:
    """Carve, adapt (when configured and not done yet) and freeze the adapter; see the module docstring."""
    model = trainer.model
    settings = model.config.adaptation_config()
    if settings is None:
        return
    record, first = model.config.adaptation_record, trainer.stream[0]
    data = first.train
    # A resumed run carves again (the same draw), so its stream is the one it started with.
    if settings.on == "adaptation_split" and (record is None or (record.get("on") == "adaptation_split"
                                                                and record.get("task") == first.name)):
        data, trainer.stream[0] = carve_adaptation_split(first, settings.per_class, trainer.config.seed)
    adapter = adapter_parameters(model)
    if record is None:
        if not adapter:
            raise ValueError(f"CLConfig.adaptation is set but method {model.config.method!r} has nothing to adapt "
                             "(no trainable parameter outside the head)")
        model.config.adaptation_record = _adapt(trainer, settings, adapter, first, data)
    for param in adapter:
        param.requires_grad_(False)


def _adapt(trainer: Any, settings: "AdaptationConfig", adapter: list[torch.nn.Parameter],
           first: Experience, data: "Dataset") -> dict[str, Any]:
    model, accelerator, cfg = trainer.model, trainer.accelerator, trainer.config
    started = time.perf_counter()
    head, classes = model.head, list(first.classes)
    generator = torch.Generator().manual_seed(model.config.head_init_seed * 1_000_003 + 24)
    temporary = IncrementalClassifier(head.in_features, max(classes) + 1, generator=generator)
    model.head = temporary.to(accelerator.device)
    task_classes, model.method.task_classes = model.method.task_classes, classes  # the loss's current task
    hooks, phase = model.method.hooks_during_adaptation, dataclasses.replace(first, train=data)

    def context(step: int) -> StepContext:  # the phase counts its own steps (the stream's are still 0)
        return dataclasses.replace(trainer.context(0), step_in_task=step, global_step=step, epochs=settings.epochs)

    params = [*adapter, *temporary.parameters()]
    lr = settings.learning_rate or cfg.learning_rate
    optimizer_class = torch.optim.SGD if cfg.optimizer == "sgd" else torch.optim.AdamW
    optimizer = optimizer_class(params, lr=lr, weight_decay=settings.weight_decay)
    steps = 0
    try:
        train_model, optimizer = accelerator.prepare(model, optimizer)
        train_model.train()
        batches = dataclasses.replace(cfg, batch_size=settings.batch_size or cfg.batch_size)
        loader = training_loader(phase.train_stream(settings.epochs), trainer.collator, batches, accelerator)
        if hooks:
            model.method.begin_task(model, phase, context(0))
        show = cfg.progress and accelerator.is_local_main_process
        for batch in progress_bar(loader, progress=show, desc=f"adaptation ({first.name})", leave=False):
            with trainer.precision["train"].autocast():  # the stream's training precision; the loss in fp32
                out = train_model(**batch)
            loss = out.loss.float()
            accelerator.backward(loss)
            norm = accelerator.clip_grad_norm_(params, cfg.max_grad_norm) if cfg.max_grad_norm else None
            check_step(loss, norm, optimizer, f"first-session adaptation stopped at step {steps + 1} "
                                              f"(method {model.config.method!r})")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if hooks:
                model.method.after_step(model, batch, out, context(steps))
            steps += 1
        if hooks:
            model.method.on_task_end(model, phase, context(steps))
        check_finite_state(model, "first-session adaptation ended")  # before the stream builds on it
        release_prepared(accelerator, optimizer)
    finally:
        model.head, model.method.task_classes = head, task_classes
    if isinstance(head, StatisticsHead):
        head.load_extra_state(head.extra_state())  # back empty: it reads the stream from step 0
    trainer.note_trainable("adaptation", params)
    trainer.result.records["adaptation"] = {"steps": steps, "seconds": time.perf_counter() - started,
                                            "learning_rate": lr}
    names = first.info.get("class_names") or [str(c) for c in classes]
    return {"on": settings.on, "task": first.name, "classes": list(names), "examples": len(data),
            "epochs": settings.epochs}


@torch.no_grad()
def reaccumulate_statistics(trainer: Any, task_id: int) -> None:
    """Reset the statistics head and read the training streams of tasks 0..task_id again, once each
    as the stream read them (``training_stream``), in eval mode: statistics only."""
    model = trainer.model
    head = model.head
    if not isinstance(head, StatisticsHead):
        return
    head.load_extra_state(head.extra_state())  # zero statistics, nothing pending; same classes and settings
    model.eval()
    ctx = trainer.context(task_id)
    for j in range(task_id + 1):
        data = model.method.training_stream(trainer.stream[j], trainer.stream[: j + 1], trainer.config.epochs)
        for batch in training_loader(data, trainer.collator, trainer.config, trainer.accelerator):
            with trainer.precision["features"].autocast():  # the head's sums stay float64
                out = model(**model_inputs(batch))
            accumulate_global_batch(head, out.features, batch["labels"], ctx)


def accumulate_global_batch(head: StatisticsHead, features: torch.Tensor, labels: torch.Tensor,
                            ctx: StepContext) -> None:
    """Add a global batch to the head's pending sums exactly once: process 0 adds it, gathered."""
    if ctx.num_processes > 1:
        features, labels = ctx.gather(features), ctx.gather(labels)
    if ctx.process_index == 0:
        head.accumulate(features, labels)
