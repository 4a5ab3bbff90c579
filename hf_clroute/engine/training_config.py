"""How the stream is trained: :class:`TrainingConfig`, the settings the continual loop reads."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_clroute.backbones.precision import check_setting
from hf_clroute.engine.batches import seed_worker
from hf_clroute.errors import UserInputError


@dataclass
class TrainingConfig:
    """How the stream is trained; the method's own knobs live in its adapter config."""

    learning_rate: float = field(default=1e-3, metadata={"help": "Optimiser learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    optimizer: str = field(default="adamw", metadata={"help": "'adamw' or 'sgd'."})
    batch_size: int = field(default=10, metadata={"help": "Global training batch (split across processes)."})
    eval_batch_size: int = field(default=256, metadata={"help": "Global evaluation batch."})
    epochs: int = field(default=1, metadata={"help": "Passes over each task: 1 = online, more = offline."})
    eval_every: int = field(
        default=0, metadata={"help": "Evaluate seen tasks every N steps (anytime accuracy); 0 = off."}
    )
    evals_per_task: int = field(
        default=0,
        metadata={"help": "Anytime evaluations per task, spread evenly over its steps, the last one at the task's "
                          "end (read off the boundary row, at no extra cost); when > 0 it replaces eval_every."},
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm; 0 = off."})
    precision: str | None = field(
        default=None,
        metadata={"help": "'auto', 'bf16' or 'fp32': bf16 autocast for training, feature extraction and "
                          "evaluation ('auto': only where measured faster on this hardware, see "
                          "hf_clroute.backbones.precision); None = $HF_CLROUTE_PRECISION, else 'auto'. Losses stay "
                          "float32 and statistics float64 either way."},
    )
    fused_optimizer: bool | None = field(
        default=None,
        metadata={"help": "Torch's fused optimizer step (one kernel over all parameters instead of the "
                          "per-parameter loop; its AdamW differs from the loop in the last bit); None = on when "
                          "training runs in bf16, so fp32 runs keep the loop's numbers bit for bit."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for weights, dropout and head growth."})
    checkpoint_dir: str | None = field(default=None, metadata={"help": "Where checkpoints go; None = no checkpoints."})
    checkpoint_every: int = field(default=0, metadata={"help": "Also checkpoint every N steps (0 = task ends only)."})
    keep_checkpoints: int = field(
        default=2, metadata={"help": "Keep only the newest N checkpoints (0 = keep all)."}
    )
    stop_after_steps: int = field(
        default=0,
        metadata={"help": "Stop (resumably) after this many global steps, for time-limited jobs; 0 = run all."},
    )
    log_with: str | None = field(default=None, metadata={"help": "Accelerate tracker name (e.g. 'tensorboard')."})
    progress: bool = field(default=True, metadata={"help": "Show progress bars on the main process."})
    num_workers: int = field(
        default=-1,
        metadata={"help": "DataLoader worker processes that read, decode and collate batches; -1 = auto: "
                          "min(4, cores - 1) on a machine with more than 2 cores, else 0 (in the training "
                          "process). The batches and their order are the same for any value."},
    )
    prefetch_factor: int = field(
        default=2, metadata={"help": "Batches each worker prepares ahead (only with num_workers > 0)."}
    )
    pin_memory: bool | None = field(
        default=None,
        metadata={"help": "Page-lock batches for faster copies to the GPU; None = auto (on when training on CUDA)."},
    )
    eval_cache_examples: int = field(
        default=20_000,
        metadata={"help": "Keep the collated batches of a test split of at most this many examples from one "
                          "evaluation to the next, instead of reading and collating it again (0 = off). "
                          "The scores are the same."},
    )
    eval_cache_mb: float = field(
        default=1024.0,
        metadata={"help": "Memory cap on those kept test batches, all tasks together (MB); batches past it are "
                          "read again at each evaluation."},
    )

    def __post_init__(self) -> None:
        for name in ("learning_rate", "weight_decay", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                raise UserInputError(f"TrainingConfig.{name} must be a finite number, got {getattr(self, name)!r}")
        if self.precision is not None:
            check_setting(self.precision, "TrainingConfig.precision")
        for name in ("learning_rate", "batch_size", "eval_batch_size", "epochs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainingConfig.{name} must be positive, got {getattr(self, name)!r}")
        for name in ("eval_every", "evals_per_task", "checkpoint_every", "keep_checkpoints", "stop_after_steps",
                     "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainingConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"TrainingConfig.optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("TrainingConfig.checkpoint_every needs TrainingConfig.checkpoint_dir")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < -1:
            raise ValueError(
                f"TrainingConfig.num_workers must be an integer >= 0, or -1 (auto), got {self.num_workers!r}")
        prefetch = self.prefetch_factor
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"TrainingConfig.prefetch_factor must be an integer >= 1, got {self.prefetch_factor!r}")
        if self.fused_optimizer not in (None, True, False):
            raise UserInputError("TrainingConfig.fused_optimizer must be true, false or null (auto), "
                                 f"got {self.fused_optimizer!r}")
        if self.pin_memory not in (None, True, False):
            raise ValueError(f"TrainingConfig.pin_memory must be true, false or null (auto), got {self.pin_memory!r}")
        for name in ("eval_cache_examples", "eval_cache_mb"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainingConfig.{name} must be >= 0, got {getattr(self, name)!r}")

    @property
    def mode(self) -> str:
        return "online" if self.epochs == 1 else "offline"

    @property
    def workers(self) -> int:
        """``num_workers`` with -1 resolved for this machine (the cores this process may use)."""
        if self.num_workers >= 0:
            return self.num_workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return min(4, cores - 1) if cores > 2 else 0

    def loader_options(self, device: torch.device) -> dict[str, Any]:
        """DataLoader keyword arguments for ``num_workers``, ``prefetch_factor`` and ``pin_memory``."""
        pin = device.type == "cuda" if self.pin_memory is None else self.pin_memory
        workers = self.workers
        if not workers:
            return {"num_workers": 0, "pin_memory": pin}
        return {"num_workers": workers, "prefetch_factor": self.prefetch_factor, "pin_memory": pin,
                "worker_init_fn": seed_worker}
