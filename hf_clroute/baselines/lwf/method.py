"""Learning without Forgetting (Li & Hoiem 2017), for class-incremental streams.

At each task end the model is snapshotted as the teacher; while training the
next task, the current model's logits over the old classes are distilled
towards the teacher's on the *current* inputs:
``lambda * T^2 * KL(softmax(teacher / T) || softmax(student / T))`` (T = 2 by
default; KL rather than the paper's cross-entropy, which differs by the teacher's
entropy, a constant, so the term is exactly zero when the model equals its snapshot).

What the snapshot holds and what is saved: only the *trainable* tensors are
copied (the frozen backbone tensors cannot change, so the teacher forward reuses
them through ``torch.func.functional_call``). The copy is saved with the adapter
only when it differs from the model, i.e. in a checkpoint taken mid-task; at a
task boundary (the engine's task-end checkpoints, an adapter saved after
training) the teacher *is* the model, so nothing is saved twice and the teacher
is rebuilt from the loaded weights before the next training step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from hf_clroute.baselines.ewc import ParamStore, trainable_named_parameters
from hf_clroute.baselines.lwf.config import LwFConfig
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


class LwF(ContinualMethod):
    config_class = LwFConfig
    supported_modalities = ("image", "text")

    def __init__(self, config: LwFConfig) -> None:
        super().__init__(config)
        self.teacher = ParamStore()
        self.num_old_classes = 0
        self._teacher_is_model = False  # True: the snapshot equals the model (not saved, rebuilt on load)

    def snapshot(self, model: "CLModel") -> None:
        for name, param in trainable_named_parameters(model).items():
            self.teacher.put(name, param.detach().clone(), persistent=False)
        self._teacher_is_model = True

    def distillation(self, model: "CLModel", inputs: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        """The LwF term for a batch whose current logits are ``logits``."""
        old = self.num_old_classes
        was_training = model.training
        model.eval()  # the teacher predicts without dropout
        with torch.no_grad():
            teacher = functional_call(model, dict(self.teacher.items()), args=(), kwargs=inputs, strict=False).logits
        model.train(was_training)
        T = self.config.temperature
        # .float(): under bf16 autocast log_softmax would run in bf16; losses stay fp32
        log_student = F.log_softmax(logits[:, :old].float() / T, dim=-1)
        log_teacher = F.log_softmax(teacher[:, :old].float() / T, dim=-1)
        kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
        return self.config.lwf_lambda * T * T * kl

    def extra_losses(self, model, batch, logits) -> dict[str, torch.Tensor]:
        if self.num_old_classes == 0:
            return {}
        self._rebuild_if_needed(model)
        return {"lwf": self.distillation(model, model_inputs(batch), logits)}

    def on_task_start(self, model, experience, ctx: StepContext) -> None:
        self._rebuild_if_needed(model)

    def after_step(self, model, batch, out, ctx: StepContext) -> None:
        if self._teacher_is_model and self.num_old_classes:
            self.teacher.set_persistent(True)  # the model moved on: a checkpoint must carry the teacher
            self._teacher_is_model = False

    def on_task_end(self, model, experience, ctx: StepContext) -> None:
        self.snapshot(model)
        self.num_old_classes = model.head.num_classes

    def _rebuild_if_needed(self, model: "CLModel") -> None:
        # Loaded from a task boundary: the teacher was not saved because it was the model.
        if self.num_old_classes and not len(self.teacher.items()):
            self.snapshot(model)

    def extra_state(self) -> dict[str, Any]:
        saved = self.teacher.shapes() if not self._teacher_is_model else {}
        return {"num_old_classes": self.num_old_classes, "teacher": saved or None}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.num_old_classes = int(state.get("num_old_classes", 0))
        if state.get("teacher"):
            self.teacher.allocate(state["teacher"])
            self._teacher_is_model = False
