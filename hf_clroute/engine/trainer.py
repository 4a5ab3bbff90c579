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
"""

from __future__ import annotations

import copy
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..data.streams import Experience
from ..methods.base import StepContext
from ..model import CLModel
from ..outputs import CLModelOutput, model_inputs
from .callbacks import Callback
from .checkpoint import find_checkpoint, read_state, save_checkpoint
from .evaluation import EvalTimer, evaluate_experience, test_loader

#: StreamResult fields a checkpoint carries, so a resumed run reports the whole stream.
RESUMABLE_FIELDS = (
    "accuracy_matrix", "untrained_accuracy", "anytime", "train_samples", "train_seconds",
    "global_step", "completed_tasks", "records",
)


@dataclass
class TrainingConfig:
    """How the stream is trained; the method's own knobs live in its adapter config."""

    learning_rate: float = field(default=1e-3, metadata={"help": "Optimiser learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    optimizer: str = field(default="adamw", metadata={"help": "'adamw' or 'sgd'."})
    batch_size: int = field(default=10, metadata={"help": "Global training batch (split across processes)."})
    eval_batch_size: int = field(default=256, metadata={"help": "Global evaluation batch."})
    epochs: int = field(default=1, metadata={"help": "Passes over each task: 1 = online, more = offline."})
    eval_every: int = field(default=0, metadata={"help": "Evaluate seen tasks every N steps (anytime accuracy); 0 = off."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm; 0 = off."})
    seed: int = field(default=0, metadata={"help": "Seed for weights, dropout and head growth."})
    checkpoint_dir: str | None = field(default=None, metadata={"help": "Where checkpoints go; None = no checkpoints."})
    checkpoint_every: int = field(default=0, metadata={"help": "Also checkpoint every N steps (0 = task ends only)."})
    keep_checkpoints: int = field(
        default=2, metadata={"help": "Keep only the newest N checkpoints (0 = keep all)."}
    )
    stop_after_steps: int = field(
        default=0, metadata={"help": "Stop (resumably) after this many global steps, for time-limited jobs; 0 = run all."}
    )
    log_with: str | None = field(default=None, metadata={"help": "Accelerate tracker name (e.g. 'tensorboard')."})
    progress: bool = field(default=True, metadata={"help": "Show progress bars on the main process."})

    def __post_init__(self) -> None:
        for name in ("learning_rate", "batch_size", "eval_batch_size", "epochs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainingConfig.{name} must be positive, got {getattr(self, name)!r}")
        for name in ("eval_every", "checkpoint_every", "keep_checkpoints", "stop_after_steps", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainingConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"TrainingConfig.optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("TrainingConfig.checkpoint_every needs TrainingConfig.checkpoint_dir")

    @property
    def mode(self) -> str:
        return "online" if self.epochs == 1 else "offline"


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
    params: dict[str, float] = field(default_factory=dict)
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
            raise ValueError(f"method {model.config.method!r} supports {method.supported_modes} training, not {config.mode}")
        if not stream:
            raise ValueError("the stream has no experiences")
        self.model, self.stream, self.config, self.collator = model, stream, config, collator
        self.accelerator = accelerator or make_accelerator(config)
        self.callbacks = list(callbacks)
        self.run_info = {"method": model.config.method, "seed": config.seed,
                         "adapter_config": model.config.to_dict(), **(run_info or {})}
        self.result = StreamResult()
        self.timer = EvalTimer()
        self._test_loaders: dict[int, DataLoader] = {}
        self._step_in_task = 0

    # ---- public ---------------------------------------------------------------
    def fit(self, resume_from: str | Path | None = None) -> StreamResult:
        accelerator, cfg = self.accelerator, self.config
        set_seed(cfg.seed)
        self.model.to(accelerator.device)
        if cfg.log_with:
            accelerator.init_trackers("hf_clroute", config={"training": asdict(cfg), "method": self.model.config.to_dict()})
        start_task = self._resume(resume_from) if resume_from else 0
        if not self.result.untrained_accuracy:
            self.result.untrained_accuracy = self._untrained_accuracy()
        for task_id in range(start_task, len(self.stream)):
            if not self._train_experience(task_id):
                break  # stopped by stop_after_steps; resumable from the last checkpoint
        self.result.finished = self.result.completed_tasks == len(self.stream)
        self.result.params = self.model.parameter_counts()
        self.result.peak_mem_mb = peak_memory_mb(accelerator.device)
        self.result.eval_samples, self.result.eval_seconds = self.timer.samples, self.timer.seconds
        if cfg.log_with:
            accelerator.end_training()
        return self.result

    def evaluate_row(self, task_id: int, upto: int | None = None) -> list[float]:
        """Accuracy (or perplexity) on every task's test split, or on tasks <= upto."""
        self.model.before_evaluation(self.context(task_id))
        if upto is not None:
            return [self._evaluate(j) for j in range(upto + 1)]
        if self.model.config.scenario == "class" and self.model.spec.modality != "lm":
            # Class-incremental: no method can predict a class it has not met, so a task
            # beyond the next one scores exactly 0 and is not worth a pass over its data.
            # (The next task is still evaluated: forward transfer reads R[t][t+1].)
            upto = min(task_id + 1, len(self.stream) - 1)
            return [self._evaluate(j) for j in range(upto + 1)] + [0.0] * (len(self.stream) - upto - 1)
        return [self._evaluate(j) for j in range(len(self.stream))]

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
        resuming_mid_task = self._step_in_task > 0
        if model.config.scenario == "domain":
            model.grow_head(max(max(e.classes) for e in self.stream) + 1)
        elif experience.classes:
            model.grow_head(max(experience.classes) + 1)
        model.begin_task(experience, self.context(task_id))

        trainable = model.trainable_parameters()
        data = model.method.training_stream(experience, self.stream[: task_id + 1], cfg.epochs)
        loader = DataLoader(data, batch_size=cfg.batch_size, collate_fn=self.collator)
        if trainable:
            optimizer = self._optimizer(trainable)
            train_model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        else:  # nothing to train (e.g. NCM): no DDP wrapper, statistics are reduced by the method
            train_model, optimizer, loader = model, None, accelerator.prepare(loader)
        if resuming_mid_task:
            accelerator.load_state(str(self._resume_dir / "accelerate"))
            loader = accelerator.skip_first_batches(loader, self._step_in_task)

        show = cfg.progress and accelerator.is_local_main_process
        bar = tqdm(loader, desc=f"task {task_id} ({experience.name})", disable=not show, leave=False)
        for batch in bar:
            started = time.perf_counter()
            out = self._step(train_model, optimizer, trainable, batch)
            model.after_step(batch, out, self.context(task_id))
            self._count_train(batch, time.perf_counter() - started)
            self._step_in_task += 1
            self.result.global_step += 1
            step = self.result.global_step
            if out.loss is not None and step % 10 == 0:
                loss = out.loss.item()
                bar.set_postfix(loss=f"{loss:.3f}")
                if cfg.log_with:
                    accelerator.log({"train/loss": loss}, step=step)
            if cfg.eval_every and step % cfg.eval_every == 0:
                self._anytime_eval(task_id)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self._checkpoint(task_id)
            if cfg.stop_after_steps and step >= cfg.stop_after_steps:
                return False

        model.end_task(experience, self.context(task_id))
        self.result.accuracy_matrix.append(self.evaluate_row(task_id))
        if cfg.log_with:
            accelerator.log({f"eval/R_{task_id}_{j}": v for j, v in enumerate(self.result.accuracy_matrix[-1])}, step=self.result.global_step)
        for callback in self.callbacks:
            callback.on_task_end(self, task_id)
        self.result.completed_tasks = task_id + 1
        self._step_in_task = 0
        accelerator.free_memory()  # drop this task's DDP wrapper/optimizer; the next task may add parameters
        if cfg.checkpoint_dir:
            self._checkpoint(task_id + 1, context_task=task_id)
        return True

    def _step(self, train_model, optimizer, trainable, batch) -> CLModelOutput:
        """One model call and, when there is something to train, one optimiser step."""
        if optimizer is None:  # statistics only: no loss to compute
            with torch.no_grad():
                return train_model(**model_inputs(batch))
        train_model.train()
        out = train_model(**batch)
        self.accelerator.backward(out.loss)
        if self.config.max_grad_norm:
            self.accelerator.clip_grad_norm_(trainable, self.config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out

    def _optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        cfg = self.config
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def _count_train(self, batch: dict[str, torch.Tensor], seconds: float) -> None:
        # Every process counts the global batch it took part in; the same on 1 or N.
        if self.result.global_step >= self.warmup_steps:
            first = next(iter(batch.values()))
            self.result.train_samples += first.shape[0] * self.accelerator.num_processes
            self.result.train_seconds += seconds

    # ---- evaluation ----------------------------------------------------------------
    def _evaluate(self, task_id: int) -> float:
        if task_id not in self._test_loaders:
            self._test_loaders[task_id] = test_loader(self.stream[task_id], self.collator, self.config.eval_batch_size, self.accelerator)
        classes = self.stream[task_id].classes if self.model.config.scenario == "task" else None
        return evaluate_experience(self.model, self._test_loaders[task_id], self.accelerator, task_classes=classes, timer=self.timer)

    def _anytime_eval(self, task_id: int) -> None:
        row = self.evaluate_row(task_id, upto=task_id)
        self.result.anytime.append([self.result.global_step, sum(row) / len(row)])

    def _untrained_accuracy(self) -> list[float]:
        """b_j: task j scored by the model before any training, grown as it would be at task j.

        Evaluated on a copy, with the RNG forked, so measuring it changes nothing downstream.
        """
        original = self.model
        with torch.random.fork_rng(devices=[]):
            self.model = copy.deepcopy(original)
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
        # Pending statistics (e.g. NCM sums not yet reduced) must be in the saved tensors.
        task = next_task if context_task is None else context_task
        self.model.before_evaluation(self.context(task))
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
        for key in RESUMABLE_FIELDS:
            setattr(self.result, key, state[key])
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
                raise ValueError(f"checkpoint {path} is from another run: {key} is {stored[key]!r} there but {value!r} in this run")
