"""Per-phase learning-rate schedules for the char-LM suites (warm-up, then cosine decay).

A char-LM suite with ``phases`` trains each domain for a stated number of steps under its own
schedule: domain A to convergence, each later domain under an adaptation budget (its steps and
peak rate). :class:`ScheduledTrainer` gives every task's fresh optimiser its phase's schedule
and sets the rate before each step, so step ``i`` of a phase trains at exactly
``LRSchedule.lr_at(i)`` (recorded in ``lr_history``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_clroute.core.outputs import model_inputs
from hf_clroute.engine import ContinualTrainer
from hf_clroute.errors import UserInputError

SCHEDULES = ("cosine", "constant")


@dataclass
class LRSchedule:
    """One phase (domain) of a char-LM suite: how many steps, at what rates."""

    steps: int = field(metadata={"help": "Optimiser steps on this domain (batches of the suite's batch_size; the "
                                         "domain's windows are reshuffled and repeated as often as needed)."})
    learning_rate: float = field(metadata={"help": "Peak learning rate, reached at the end of the warm-up."})
    warmup_steps: int = field(default=0, metadata={"help": "Steps of linear warm-up from learning_rate / warmup_steps "
                                                           "to learning_rate (0 = start at the peak)."})
    schedule: str = field(default="cosine", metadata={"help": "After the warm-up: 'cosine' decays to min_lr_ratio x "
                                                              "learning_rate at the last step; 'constant' stays at the "
                                                              "peak."})
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "Final rate of the cosine decay, as a fraction of the peak."})

    def __post_init__(self) -> None:
        for name in ("steps", "warmup_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "steps" else 0):
                raise UserInputError(
                    f"LRSchedule.{name} must be an integer >= {1 if name == 'steps' else 0}, got {value!r}")
        if self.warmup_steps >= self.steps:
            raise UserInputError(f"LRSchedule.warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        if not isinstance(self.learning_rate, (int, float)) or self.learning_rate <= 0:
            raise UserInputError(f"LRSchedule.learning_rate must be positive, got {self.learning_rate!r}")
        if self.schedule not in SCHEDULES:
            raise UserInputError(f"LRSchedule.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserInputError(f"LRSchedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")

    def lr_at(self, step: int) -> float:
        """The rate of step ``step`` (0-based) of this phase."""
        peak, warm = self.learning_rate, self.warmup_steps
        if step < warm:
            return peak * (step + 1) / warm
        if self.schedule == "constant":
            return peak
        decay_steps = max(self.steps - warm - 1, 1)
        progress = min((step - warm) / decay_steps, 1.0)
        floor = self.min_lr_ratio * peak
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("steps", "learning_rate", "warmup_steps", "schedule", "min_lr_ratio")}


#: a task's schedule that reads its batches without training (evaluation mode, no gradient, no hook counts):
#: a model trained on domain A elsewhere continues on the later domains as tasks 1, 2, ...
EVALUATE_ONLY = "evaluate-only"


class ScheduledTrainer(ContinualTrainer):
    """A :class:`ContinualTrainer` whose task ``t`` trains under ``schedules[t]`` (None: the config's
    constant rate; :data:`EVALUATE_ONLY`: no training). Each task gets a fresh optimiser (the
    engine's), so each phase restarts its schedule (and AdamW's moments) at step 0."""

    def __init__(self, *args: Any, schedules: list[LRSchedule | str | None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schedules = schedules
        #: per task: the rate every step of it trained at
        self.lr_history: list[list[float]] = []

    def _schedule(self) -> LRSchedule | str | None:
        task = self.result.completed_tasks
        return self.schedules[task] if task < len(self.schedules) else None

    def _step(self, train_model: Any, optimizer: Any, trainable: Any, batch: dict[str, torch.Tensor]) -> Any:
        if self._schedule() != EVALUATE_ONLY:
            return super()._step(train_model, optimizer, trainable, batch)
        self.model.eval()  # no dropout, and routed layers count no usage
        with torch.no_grad():
            return train_model(**model_inputs(batch))

    def _optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        optimizer = super()._optimizer(params)
        schedule = self._schedule()
        if schedule == EVALUATE_ONLY:
            schedule = None
        history: list[float] = []
        self.lr_history.append(history)

        def set_rate(step: int) -> None:
            rate = schedule.lr_at(step) if schedule is not None else self.config.learning_rate
            for group in optimizer.param_groups:
                group["lr"] = rate

        def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            history.append(opt.param_groups[0]["lr"])

        def after_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            set_rate(len(history))  # the next step's rate

        set_rate(0)
        optimizer.register_step_pre_hook(before_step)
        optimizer.register_step_post_hook(after_step)
        return optimizer
