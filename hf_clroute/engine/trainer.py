"""The continual loop on Accelerate.

For each experience: grow the head, call the method's hooks, read the task's
training stream once (online) or for E epochs (offline), evaluate every seen
task every ``eval_every`` steps (anytime accuracy) and every task at the task
boundary (a row of the accuracy matrix). Checkpoints (``save_state`` plus the
adapter and a small JSON of loop state) let a killed run resume and finish with
the same accuracy matrix as a run that never stopped.

Batches are *global*: ``split_batches=True`` gives each of N processes a slice
of the same batch one process would see, so 1 and N processes follow the same
optimisation trajectory up to floating-point noise.

Data: a task's stream is read in whole batches by :func:`~.loading.training_loader` (the
same batches, in the same order, for any number of workers); a test split is collated once
and its batches reused by later evaluations (``eval_cache_examples``). At a task end
the prepared wrappers are dropped without a full ``gc.collect()`` (:func:`release_prepared`).
"""

from __future__ import annotations

import copy
import itertools
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    set_seed,
)
from torch.utils.data import DataLoader

from hf_clroute.core.config import CLConfig
from hf_clroute.core.labels import align_stream, copy_labels
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import CLModel
from hf_clroute.core.outputs import CLModelOutput, model_inputs
from hf_clroute.data.experiences import Experience
from hf_clroute.engine.batches import training_loader
from hf_clroute.engine.callbacks import Callback
from hf_clroute.engine.checkpoint import find_checkpoint, read_state, save_checkpoint
from hf_clroute.engine.evaluation import (
    EvalCache,
    EvalTimer,
    batch_bytes,
    evaluate_experience,
    feature_batches,
    test_loader,
)
from hf_clroute.engine.first_session import prepare_adaptation, reaccumulate_statistics
from hf_clroute.engine.numerics import (
    check_finite_state,
    check_step,
    describe,
    phase_choices,
)
from hf_clroute.engine.prepared import grad_clipper, optimizer_to_step, release_prepared
from hf_clroute.engine.training_config import TrainingConfig
from hf_clroute.runtime.progress import bars_enabled, log_line, progress_bar, task_line
from hf_clroute.runtime.threads import apply_default_threads

#: StreamResult fields a checkpoint carries, so a resumed run reports the whole stream.
RESUMABLE_FIELDS = (
    "accuracy_matrix", "untrained_accuracy", "anytime", "train_samples", "train_seconds",
    "global_step", "completed_tasks", "records", "params",
)


@dataclass
class StreamResult:
    """Everything a run measured; ``metrics.continual.summarize`` turns it into A_T, F_T..."""

    accuracy_matrix: list[list[float]] = field(default_factory=list)
    untrained_accuracy: list[float] = field(default_factory=list)
    anytime: list[list[float]] = field(default_factory=list)  # [global_step, mean accuracy over seen tasks]
    train_samples: int = 0
    train_seconds: float = 0.0
    eval_samples: int = 0
    eval_seconds: float = 0.0
    global_step: int = 0
    completed_tasks: int = 0
    finished: bool = False
    peak_mem_mb: float = 0.0
    # trainable parameters as trained: the maximum over the run ("trainable_params", "trainable_pct"),
    # and "phases": the count from each phase on where it changed ("adaptation", "task 0", "task 1"...)
    params: dict[str, Any] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)  # callbacks' records, by callback name

    @property
    def train_samples_per_s(self) -> float:
        return self.train_samples / self.train_seconds if self.train_seconds > 0 else 0.0

    @property
    def infer_samples_per_s(self) -> float:
        return self.eval_samples / self.eval_seconds if self.eval_seconds > 0 else 0.0


def make_accelerator(config: TrainingConfig, cpu: bool = False) -> Accelerator:
    return Accelerator(
        cpu=cpu,
        log_with=config.log_with,
        project_dir=config.checkpoint_dir,
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        # Routed methods leave some parameters unused in a step (APN's inactive patches,
        # a backbone's unused pooler); DDP must not wait for their gradients.
        # Buffers (replay memories, Fisher, slot statistics) are kept identical on every
        # process by the methods themselves; re-broadcasting them each step is wasted work.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True, broadcast_buffers=False)],
    )


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class ContinualTrainer:
    """Runs one model over one stream; ``fit()`` returns a :class:`StreamResult`.

    ``callbacks`` run at every task end (e.g. the bench's forgetting probes).
    ``run_info`` (say ``{"suite": ...}``) is stored with every checkpoint with the
    method, its adapter config and the seed; resuming from a checkpoint of another
    run is refused, naming the field that differs.
    """

    #: steps excluded from the training throughput (allocation, first-call overheads).
    warmup_steps = 3

    def __init__(
        self,
        model: CLModel,
        stream: list[Experience],
        config: TrainingConfig,
        collator: Callable,
        accelerator: Accelerator | None = None,
        callbacks: Sequence[Callback] = (),
        run_info: dict[str, Any] | None = None,
    ) -> None:
        method = model.method
        if config.mode not in method.supported_modes:
            raise ValueError(f"method {model.config.method!r} supports {method.supported_modes} training, "
                             f"not {config.mode}")
        if not stream:
            raise ValueError("the stream has no experiences")
        # An adapter that already knows classes (loaded to continue training) reads the stream by
        # class name: known classes keep their head ids, new ones come after them.
        stream = align_stream(stream, model.config)
        method.check_stream(len(stream))
        self.model, self.stream, self.config, self.collator = model, stream, config, collator
        self.threads = apply_default_threads()  # before the accelerator: its process count is known by now
        self.accelerator = accelerator or make_accelerator(config)
        self._clip = grad_clipper(self.accelerator)
        self.precision = phase_choices(model, config, self.accelerator)
        self._task_id = 0
        self.callbacks = list(callbacks)
        self.run_info = {"method": model.config.method, "seed": config.seed,
                         "adapter_config": model.config.to_dict(), **(run_info or {})}
        self.result = StreamResult()
        self.timer = EvalTimer()
        self._test_loaders: dict[int, DataLoader] = {}
        self._eval_cache = EvalCache(config.eval_cache_examples, config.eval_cache_mb)
        self._test_features: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._frozen_features: dict[int, list[dict[str, torch.Tensor]]] = {}  # by task: test batches as features
        self._frozen_owner: torch.Tensor | None = None  # the features fingerprint they were computed with
        self._step_in_task = 0

    # ---- public ---------------------------------------------------------------
    def fit(self, resume_from: str | Path | None = None) -> StreamResult:
        accelerator, cfg = self.accelerator, self.config
        set_seed(cfg.seed)
        self.model.to(accelerator.device)
        if cfg.log_with:
            accelerator.init_trackers(
                "hf_clroute", config={"training": asdict(cfg), "method": self.model.config.to_dict()})
        start_task = self._resume(resume_from) if resume_from else 0
        self.result.records["precision"] = {phase: choice.to_dict() for phase, choice in self.precision.items()}
        self.result.records["threads"] = dict(self.threads)
        if self.model.method.undefined_metrics:
            self.result.records["undefined_metrics"] = list(self.model.method.undefined_metrics)
        if cfg.progress and accelerator.is_main_process:
            log_line(describe(self.precision, self.threads))
        if not self.result.untrained_accuracy:  # b_j: the model before any training, adaptation included
            self.result.untrained_accuracy = self._untrained_accuracy()
        prepare_adaptation(self)  # first-session adaptation, when configured (engine/first_session.py)
        for task_id in range(start_task, len(self.stream)):
            if not self._train_experience(task_id):
                break  # stopped by stop_after_steps; resumable from the last checkpoint
        self.result.finished = self.result.completed_tasks == len(self.stream)
        self.result.params = self._trained_parameter_counts()
        self.result.peak_mem_mb = peak_memory_mb(accelerator.device)
        self.result.eval_samples, self.result.eval_seconds = self.timer.samples, self.timer.seconds
        if cfg.log_with:
            accelerator.end_training()
        return self.result

    def evaluate_row(self, task_id: int, upto: int | None = None) -> list[float]:
        """Accuracy (or perplexity) on every task's test split, or on tasks <= upto.

        A whole row (``upto=None``) keeps the test features it computed (:meth:`test_features`).
        """
        self.model.before_evaluation(self.context(task_id))
        if self._frozen_features:  # kept test features stand only for the weights they were computed with
            owner = self.model.features_fingerprint() if self.model.reads_fixed_features() else None
            if owner is None or not torch.equal(owner, self._frozen_owner):
                self._frozen_features.clear()
        if upto is not None:
            return [self._evaluate(j) for j in range(upto + 1)]
        self._test_features.clear()
        if self.model.config.scenario == "class" and self.model.spec.modality != "lm":
            # Class-incremental: no method can predict a class it has not met, so a task
            # beyond the next one scores exactly 0 and is not worth a pass over its data.
            # (The next task is still evaluated: forward transfer reads R[t][t+1].)
            upto = min(task_id + 1, len(self.stream) - 1)
            return [self._evaluate(j, keep=True) for j in range(upto + 1)] + [0.0] * (len(self.stream) - upto - 1)
        return [self._evaluate(j, keep=True) for j in range(len(self.stream))]

    def test_features(self, task_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(features, labels) of task ``task_id``'s test split as the classifier read them in the last
        whole-row evaluation, in the split's order, batches of ``eval_batch_size``; None when that
        row did not score the task, ran on several processes, or the model has trained since.

        The task-end callbacks run on the model that row scored: a probe of the test features
        reads them here rather than running the model over the split again.
        """
        return self._test_features.get(task_id)

    def context(self, task_id: int) -> StepContext:
        """Where the stream is, with the process collectives hooks may use."""
        accelerator = self.accelerator
        return StepContext(
            task_id, self._step_in_task, self.result.global_step, self.config.epochs,
            process_index=accelerator.process_index, num_processes=accelerator.num_processes,
            _reduce=lambda t: accelerator.reduce(t.to(accelerator.device), "sum"),
            _gather=accelerator.gather_for_metrics,
        )

    # ---- the loop ----------------------------------------------------------------
    def _train_experience(self, task_id: int) -> bool:
        accelerator, cfg, model = self.accelerator, self.config, self.model
        experience = self.stream[task_id]
        self._task_id = task_id
        task_started = time.perf_counter()
        resuming_mid_task = self._step_in_task > 0
        self._test_features.clear()  # the model is about to train: the kept test features go stale
        if model.config.scenario == "domain":
            model.grow_head(max(max(e.classes) for e in self.stream) + 1)
        elif experience.classes:
            model.grow_head(max(experience.classes) + 1)
        model.begin_task(experience, self.context(task_id))

        trainable = model.trainable_parameters()
        self.note_trainable(f"task {task_id}", trainable)
        data = model.method.training_stream(experience, self.stream[: task_id + 1], cfg.epochs)
        if trainable:
            optimizer = self._optimizer(trainable)
            train_model, optimizer = accelerator.prepare(model, optimizer)
            stepped = optimizer_to_step(accelerator, optimizer)
        else:  # nothing to train (a statistics head, kNN): no DDP wrapper; the model reduces its statistics
            train_model, optimizer, stepped = model, None, None
        loader = training_loader(data, self.collator, cfg, accelerator)
        if resuming_mid_task:
            accelerator.load_state(str(self._resume_dir / "accelerate"))
            # The batches already trained on are read and dropped (a stream cannot seek).
            loader = itertools.islice(loader, self._step_in_task, None)

        eval_steps = self._anytime_steps(experience, data) if cfg.evals_per_task else set()
        show = cfg.progress and accelerator.is_local_main_process
        bar = progress_bar(loader, progress=show, desc=f"task {task_id} ({experience.name})", leave=False)
        # Off a terminal (a log file, a pipe) there is no bar: one line at the task's end says how it went.
        log_task = cfg.progress and accelerator.is_main_process and not bars_enabled()
        loss_sum, losses = 0.0, 0  # summed on the device: no sync per step
        # Every module in train mode once per task (a hook or the bench's feature encoder may have put a
        # submodule in eval mode); per step only the model's own flag is checked. A statistics-only pass
        # runs every module in eval mode, whatever trained before: no dropout while counting.
        if stepped is not None:
            train_model.train()
        else:
            model.eval()
        for batch in bar:
            started = time.perf_counter()
            out = self._step(train_model, stepped, trainable, batch)
            model.after_step(batch, out, self.context(task_id))
            self._count_train(batch, time.perf_counter() - started)
            self._step_in_task += 1
            self.result.global_step += 1
            step = self.result.global_step
            if log_task and out.loss is not None:
                loss_sum, losses = loss_sum + out.loss.detach(), losses + 1
            if out.loss is not None and step % 10 == 0:
                loss = out.loss.item()
                bar.set_postfix(loss=f"{loss:.3f}")
                if cfg.log_with:
                    accelerator.log({"train/loss": loss}, step=step)
            due = (self._step_in_task in eval_steps) if cfg.evals_per_task else (
                cfg.eval_every and step % cfg.eval_every == 0)
            if due:
                self._anytime_eval(task_id)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self._checkpoint(task_id)
            if cfg.stop_after_steps and step >= cfg.stop_after_steps:
                return False

        model.end_task(experience, self.context(task_id))
        if trainable and not model.trainable_parameters():  # the adapter froze: statistics under it alone
            reaccumulate_statistics(self, task_id)
        self.result.accuracy_matrix.append(self.evaluate_row(task_id))
        check_finite_state(model, f"training stopped after task {task_id}")  # statistics are synced by now
        if cfg.evals_per_task:  # the task's last anytime point is its boundary row over the seen tasks
            seen = self.result.accuracy_matrix[-1][: task_id + 1]
            self.result.anytime.append([self.result.global_step, sum(seen) / len(seen)])
        if cfg.log_with:
            last_row = self.result.accuracy_matrix[-1]
            accelerator.log({f"eval/R_{task_id}_{j}": v for j, v in enumerate(last_row)}, step=self.result.global_step)
        for callback in self.callbacks:
            callback.on_task_end(self, task_id)
        if log_task:
            log_line(task_line(task_id, experience.name, time.perf_counter() - task_started,
                               float(loss_sum / losses) if losses else None, self.result.accuracy_matrix[-1],
                               perplexity=model.spec.modality == "lm"))
        self.result.completed_tasks = task_id + 1
        self._step_in_task = 0
        release_prepared(accelerator, optimizer)  # this task's DDP wrapper/optimizer; the next may add parameters
        if cfg.checkpoint_dir:
            self._checkpoint(task_id + 1, context_task=task_id)
        return True

    def _step(self, train_model, optimizer, trainable, batch) -> CLModelOutput:
        """One model call and, when there is something to train, one optimiser step.

        The forward runs under the training phase's autocast (a no-op in fp32); the loss is taken
        in float32 for the backward. Before the step, one check (one device sync) stops the run when
        the loss, the clipped gradients' norm or a learning rate is not finite: a step with them
        would write NaN or inf into every trained parameter.
        """
        if optimizer is None:  # statistics only: no loss to compute
            with torch.no_grad(), self.precision["train"].autocast():
                return train_model(**model_inputs(batch))
        if not self.model.training:  # an anytime evaluation or a hook put the model in eval mode
            train_model.train()
        with self.precision["train"].autocast():
            out = train_model(**batch)
        loss = out.loss.float()
        self.accelerator.backward(loss)
        norm = self._clip(trainable, self.config.max_grad_norm) if self.config.max_grad_norm else None
        check_step(loss, norm, optimizer,
                   f"training stopped at task {self._task_id} step {self._step_in_task + 1} "
                   f"(global step {self.result.global_step + 1}, method {self.model.config.method!r})")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out

    def _optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        cfg = self.config
        fused = cfg.fused_optimizer
        if fused is None:  # fused where the numbers change anyway: a bf16 training phase
            fused = self.precision["train"].dtype is not None
        options = {"lr": cfg.learning_rate, "weight_decay": cfg.weight_decay, "fused": True} if fused else \
            {"lr": cfg.learning_rate, "weight_decay": cfg.weight_decay}
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(params, **options)
        return torch.optim.AdamW(params, **options)

    def note_trainable(self, phase: str, params: Sequence[torch.nn.Parameter]) -> None:
        """Record the trainable count of ``phase`` (e.g. "adaptation", "task 0") when it differs from the last one."""
        count = sum(p.numel() for p in params)
        phases = self.result.params.setdefault("phases", {})
        if not phases or list(phases.values())[-1] != count:
            phases[phase] = count

    def _trained_parameter_counts(self) -> dict[str, Any]:
        """``parameter_counts`` with the trainable count taken as the largest of the run's phases (what
        trained, not what is still trainable at the end, after routers or an adapter froze)."""
        counts = self.model.parameter_counts()
        phases = self.result.params.get("phases") or {}
        trained = max([counts["trainable_params"], *phases.values()])
        return {**counts, "trainable_params": trained,
                "trainable_pct": 100.0 * trained / max(counts["backbone_params"], 1), "phases": dict(phases)}

    def _count_train(self, batch: dict[str, torch.Tensor], seconds: float) -> None:
        # Every process counts the global batch it took part in; the same on 1 or N.
        if self.result.global_step >= self.warmup_steps:
            first = next(iter(batch.values()))
            self.result.train_samples += first.shape[0] * self.accelerator.num_processes
            self.result.train_seconds += seconds

    # ---- evaluation ----------------------------------------------------------------
    def _evaluate(self, task_id: int, keep: bool = False) -> float:
        """Score task ``task_id``'s test split; ``keep`` keeps its features for :meth:`test_features`."""
        if task_id not in self._test_loaders:
            self._test_loaders[task_id] = test_loader(
                self.stream[task_id], self.collator, self.config.eval_batch_size, self.accelerator,
                cache=self._eval_cache, **self.config.loader_options(self.accelerator.device))
        classes = self.stream[task_id].classes if self.model.config.scenario == "task" else None
        loader = self._frozen_test_batches(task_id) or self._test_loaders[task_id]
        kept = [] if keep and self.accelerator.num_processes == 1 and self.model.spec.modality != "lm" else None
        score = evaluate_experience(self.model, loader, self.accelerator, task_classes=classes,
                                    timer=self.timer, progress=self.config.progress, precision=self.precision["eval"],
                                    desc=f"eval task {task_id} ({self.stream[task_id].name})", features=kept)
        if kept:
            self._test_features[task_id] = (torch.cat([x for x, _ in kept]), torch.cat([y for _, y in kept]))
        return score

    def _frozen_test_batches(self, task_id: int) -> list[dict[str, torch.Tensor]] | None:
        """Task ``task_id``'s test batches as backbone features, computed at its first evaluation, when
        the model's features can no longer change (``CLModel.reads_fixed_features``: a frozen backbone, or
        an adapter frozen after first-session adaptation), the split's batches are kept
        (``eval_cache_examples``) and one process evaluates; else None."""
        if task_id in self._frozen_features:
            return self._frozen_features[task_id] if self.model.reads_fixed_features() else None
        test = self.stream[task_id].test
        if (self.accelerator.num_processes > 1 or not self._eval_cache.admits(test)
                or "features" in getattr(test, "column_names", ()) or not self.model.reads_fixed_features()):
            return None
        started = time.perf_counter()
        batches = feature_batches(self.model, self._test_loaders[task_id], precision=self.precision["features"])
        self.timer.seconds += time.perf_counter() - started  # evaluation time, though paid once
        if not self._eval_cache.take(batch_bytes(batches)):
            return None
        if not self._frozen_features:
            self._frozen_owner = self.model.features_fingerprint()
        self._frozen_features[task_id] = batches
        return batches

    def _anytime_steps(self, experience: Experience, data: Any) -> set[int]:
        """Steps within the task (counted from 1) after which to evaluate, ``evals_per_task - 1`` of
        them evenly spaced before the task's end (which the boundary row covers)."""
        try:
            samples = len(data)
        except TypeError:  # an iterable stream: the method says how much it reads (joint: every task seen)
            samples = self.model.method.training_examples(
                experience, self.stream[: self._task_id + 1], self.config.epochs)
        steps = -(-samples // self.config.batch_size)
        n = self.config.evals_per_task
        return {round(k * steps / n) for k in range(1, n)} - {0, steps}

    def _anytime_eval(self, task_id: int) -> None:
        row = self.evaluate_row(task_id, upto=task_id)
        self.result.anytime.append([self.result.global_step, sum(row) / len(row)])

    def _untrained_accuracy(self) -> list[float]:
        """b_j: task j scored by the model before any training, grown as it would be at task j.

        Evaluated on a copy, with the RNG forked, so measuring it changes nothing downstream.
        The copy shares the backbone's tensors (evaluation only reads them; the head grows on
        the copy): a second backbone would be the run's peak memory.
        """
        original = self.model
        backbone = original.backbone
        shared = {id(t): t for t in itertools.chain(backbone.parameters(), backbone.buffers())}
        with torch.random.fork_rng(devices=[]):
            self.model = copy.deepcopy(original, shared)
            try:
                scores = []
                for j, experience in enumerate(self.stream):
                    if experience.classes:
                        self.model.grow_head(max(experience.classes) + 1)
                    scores.append(self._evaluate(j))
            finally:
                self.model = original
        return scores

    # ---- checkpoints -------------------------------------------------------------------
    def _checkpoint(self, next_task: int, context_task: int | None = None) -> None:
        # Pending statistics (a statistics head's sums not yet reduced) must be in the saved tensors.
        task = next_task if context_task is None else context_task
        self.model.before_evaluation(self.context(task))
        check_finite_state(self.model, f"checkpoint at global step {self.result.global_step} refused")
        state = {"next_task": next_task, "step_in_task": self._step_in_task, "run": self.run_info,
                 **{k: getattr(self.result, k) for k in RESUMABLE_FIELDS},
                 "eval_samples": self.timer.samples, "eval_seconds": self.timer.seconds}
        save_checkpoint(Path(self.config.checkpoint_dir), self.result.global_step, self.accelerator, self.model,
                        state, keep=self.config.keep_checkpoints)

    def _resume(self, resume_from: str | Path) -> int:
        path = find_checkpoint(resume_from)
        state = read_state(path)
        self._check_same_run(state.get("run", {}), path)
        self.model.load_adapter_weights(path / "adapter", source=str(path))
        saved = CLConfig.from_pretrained(path / "adapter")
        copy_labels(saved, self.model.config)  # the classes met before the stop
        self.model.config.adaptation_record = saved.adaptation_record  # adapted before the stop: not again
        for key in RESUMABLE_FIELDS:
            setattr(self.result, key, state.get(key, getattr(self.result, key)))
        self.timer.samples, self.timer.seconds = state["eval_samples"], state["eval_seconds"]
        self._step_in_task = state["step_in_task"]
        self._resume_dir = path
        if self._step_in_task == 0:  # a task boundary: only the RNG state is in the accelerate dir
            self.accelerator.load_state(str(path / "accelerate"))
        return state["next_task"]

    def _check_same_run(self, stored: dict[str, Any], path: Path) -> None:
        """Refuse a checkpoint written by another run (seed, method, suite, adapter config)."""
        for key, value in self.run_info.items():
            if key not in stored:
                continue
            if key == "adapter_config":
                differ = sorted(k for k in set(value) | set(stored[key]) if value.get(k) != stored[key].get(k))
                if differ:
                    field_name = differ[0]
                    raise ValueError(
                        f"checkpoint {path} is from another run: adapter config field {field_name!r} is "
                        f"{stored[key].get(field_name)!r} there but {value.get(field_name)!r} in this run"
                    )
            elif stored[key] != value:
                raise ValueError(f"checkpoint {path} is from another run: {key} is {stored[key]!r} there but "
                                 f"{value!r} in this run")
