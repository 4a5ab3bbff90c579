"""MaRS on the CLModel hooks: slot memory + SGSE + DCDA over frozen pooled features.

Forward: h (frozen, pooled) -> memory -> h~ -> the shared incremental head g.

DCDA stages, and how they are kept apart. The engine builds one optimizer at
task start over every parameter with ``requires_grad``, so the memory and the
head both stay trainable and a stage *leaves the other group out of the
autograd graph* instead of freezing it (the whole step, loss included, is one
``forward``, so under DDP the output reaches every parameter the loss uses):

* stage 1 (memory only): logits use detached head weights, the loss is
  supervised contrastive on h~ + lambda_smooth * mean ||h~ - LN(h)||^2;
* stage 2 (head only): the memory runs under ``no_grad``, the loss is CE + LwF
  distillation on current inputs + distillation on slot anchors (T = 3).

A parameter outside the graph gets ``grad=None``, which AdamW and SGD skip
entirely (no momentum, no weight decay), so stage 1 provably never changes the
head and stage 2 never the memory. (Multiplying a loss by zero would not do:
Adam's momentum would still move the parameters.)

The smoothness term compares h~ with LN(h), the memory's identity output,
rather than raw h: the per-slot affine cannot undo the per-sample
normalisation, so "no drift" means h~ = LN(h).

SGSE sees every training input (the confidences and queries of the global
batch, gathered across processes, so every process takes the same decision)
and switches on a preallocated slot when it fires: the parameter set never
changes mid-task.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ...outputs import CLModelOutput, model_inputs
from ..base import ContinualMethod, StepContext
from .config import MarsConfig
from .sgse import ExpansionTest
from .slot_memory import Routing, SlotCapacityError, SlotMemory

if TYPE_CHECKING:  # pragma: no cover
    from ...data.streams import Experience
    from ...model import CLModel


def supervised_contrastive(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """SupCon (Khosla et al. 2020) over one batch; anchors without a positive are skipped."""
    z = F.normalize(features, dim=-1)
    sim = z @ z.T / temperature
    self_mask = torch.eye(len(z), dtype=torch.bool, device=z.device)
    log_prob = sim.masked_fill(self_mask, float("-inf")).log_softmax(dim=-1)
    positives = (labels.unsqueeze(0) == labels.unsqueeze(1)) & ~self_mask
    counts = positives.sum(dim=1)
    has_pos = counts > 0
    if not has_pos.any():
        return features.sum() * 0.0
    pos_log_prob = log_prob.masked_fill(~positives, 0.0).sum(dim=1)
    return -(pos_log_prob[has_pos] / counts[has_pos]).mean()


def distillation(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened outputs, scaled by T^2 (Hinton et al.)."""
    log_student = F.log_softmax(student / temperature, dim=-1)
    soft_teacher = F.softmax(teacher / temperature, dim=-1)
    return F.kl_div(log_student, soft_teacher, reduction="batchmean") * temperature**2


class Mars(ContinualMethod):
    config_class = MarsConfig
    supported_modalities = ("image", "text")
    uses_head = True

    def __init__(self, config: MarsConfig) -> None:
        super().__init__(config)
        self.config: MarsConfig = config
        self.task_step = 0  # steps and (global) samples trained in the current task
        self.task_samples = 0
        self.task_plan = 0  # samples the current task will train on (for 'sequential')
        self.keys_seeded = 0  # data-initialised keys so far
        self.old_classes = 0  # classes the head knew before this task (the teacher's outputs)
        self.classes_trained = 0
        self.skipped_expansions = 0
        self.slot_history: list[list[int]] = []

    # ---- structure ------------------------------------------------------------------
    def attach(self, model: "CLModel") -> None:
        cfg = self.config
        hidden = model.spec.hidden_size(model.backbone)
        self.memory = SlotMemory(
            hidden, num_slots=cfg.num_slots, max_slots=cfg.max_slots, query_dim=cfg.query_dim,
            tau=cfg.tau_r, seed=cfg.memory_init_seed,
        )
        self.sgse = ExpansionTest(
            self.memory.query.out_features, beta=cfg.quantile_beta, window=cfg.quantile_window,
            eps=cfg.quantile_eps, trials=cfg.test_trials, z=cfg.wilson_z, alpha=cfg.alpha,
            threshold=cfg.expansion_threshold,
        )
        if cfg.key_init == "random":
            self.keys_seeded = cfg.num_slots
        # Teacher (the head before this task) and the anchors it is distilled on; resized
        # at task start and in load_extra_state, saved with the adapter like any buffer.
        self.register_buffer("teacher_weight", torch.zeros(0, hidden))
        self.register_buffer("teacher_bias", torch.zeros(0))
        self.register_buffer("anchor_slots", torch.zeros(0, dtype=torch.long))
        self.register_buffer("anchor_means", torch.zeros(0, hidden))
        self.register_buffer("anchor_targets", torch.zeros(0, 0))
        self.slot_history = [[0, self.memory.num_slots]]

    # ---- stages ---------------------------------------------------------------------
    def stage(self) -> int:
        """1 (memory) or 2 (head) for the next training step."""
        cfg = self.config
        if not cfg.use_stage1:
            return 2
        if not cfg.use_stage2:
            return 1
        if cfg.dcda_schedule == "alternate":
            return 1 + (self.task_step // cfg.dcda_window) % 2
        return 1 if self.task_samples < cfg.stage1_fraction * self.task_plan else 2

    # ---- forward ---------------------------------------------------------------------
    def forward(self, model: "CLModel", batch: dict[str, torch.Tensor]) -> CLModelOutput:
        """h -> memory -> h~ -> head; in training the stage's loss, and the routing statistics
        ``after_step`` folds into the memory and SGSE (in ``extras``)."""
        h = self.features(model, model_inputs(batch))
        if not self.training or "labels" not in batch:
            out_h = self.memory(h).output
            return CLModelOutput(logits=model.head(out_h), features=out_h.detach())
        stage = self.stage()
        with torch.set_grad_enabled(stage == 1 and torch.is_grad_enabled()):
            routing = self.memory(h)
        if stage == 2:
            logits = model.head(routing.output)
        elif self.config.use_stage2:  # pure stage 1: the head is out of the graph
            logits = F.linear(routing.output, model.head.weight.detach(), model.head.bias.detach())
        else:  # no stage 2 (ablation): the head learns by plain CE on h~, without moving the memory
            logits = model.head(routing.output.detach())
        labels = batch["labels"]
        if stage == 2:  # the head's CE: the base loss, so ``current_task_loss`` applies
            losses = {"ce": self.loss(model, batch, logits), **self.stage2_losses(model, routing, logits)}
        else:
            losses = {"supcon": supervised_contrastive(routing.output, labels, self.config.supcon_temperature)}
            if not self.config.use_stage2:
                losses["ce"] = self.loss(model, batch, logits)
            smooth = (routing.output - routing.normed).pow(2).sum(dim=-1).mean()
            losses["smooth"] = self.config.lambda_smooth * smooth
        extras = {k: getattr(routing, k).detach() for k in ("normed", "probs", "query", "confidence")}
        return CLModelOutput(
            loss=sum(losses.values()), logits=logits, losses=losses, features=routing.output.detach(), extras=extras
        )

    def stage2_losses(self, model: "CLModel", routing: Routing, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """Distillation of the old classes: on current inputs (LwF) and on the slot anchors."""
        cfg, n_old, T = self.config, self.old_classes, self.config.distill_temperature
        if n_old == 0:
            return {}
        teacher = F.linear(routing.output, self.teacher_weight, self.teacher_bias)
        terms = {"lwf": cfg.lambda_lwf * distillation(logits[:, :n_old], teacher, T)}
        if cfg.use_anchors and len(self.anchor_slots):
            with torch.no_grad():
                anchors = self.memory.anchors(self.anchor_slots, self.anchor_means)
            student = model.head(anchors)[:, :n_old]
            terms["anchor"] = cfg.lambda_anchor * distillation(student, self.anchor_targets, T)
        return terms

    # ---- hooks -----------------------------------------------------------------------
    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        if self.task_step:  # resumed mid-task: counters and teacher came from the checkpoint
            return
        self.task_plan = len(experience.train) * ctx.epochs
        self.old_classes = self.classes_trained
        self._snapshot_teacher(model)

    @torch.no_grad()
    def _snapshot_teacher(self, model: "CLModel") -> None:
        """Keep the head as it was before this task and its outputs on the slot anchors."""
        n = self.old_classes
        self.teacher_weight = model.head.weight[:n].detach().clone()
        self.teacher_bias = model.head.bias[:n].detach().clone()
        self.anchor_slots = self.memory.anchor_slots(self.config.varsigma)
        self.anchor_means = self.memory.anchor_means(self.config.varsigma)[self.anchor_slots].clone()
        anchors = self.memory.anchors(self.anchor_slots, self.anchor_means)
        self.anchor_targets = F.linear(anchors, self.teacher_weight, self.teacher_bias)

    @torch.no_grad()
    def after_step(self, model: "CLModel", batch, out: CLModelOutput, ctx: StepContext) -> None:
        gathered = [ctx.gather(out.extras[k]) for k in ("normed", "probs", "query", "confidence")]
        normed, probs, query, confidence = (t.float() for t in gathered)
        self.memory.update_statistics(normed, probs, self.config.stat_momentum)
        self._observe(query, confidence, ctx.global_step + 1)
        self.task_step += 1
        self.task_samples += len(confidence)

    def _observe(self, query: torch.Tensor, confidence: torch.Tensor, step: int) -> None:
        """Seed the keys from the first queries, then feed every input to SGSE."""
        cfg = self.config
        for i, value in enumerate(confidence.tolist()):  # one device sync per step, not per input
            if self.keys_seeded < cfg.num_slots:
                self.memory.set_key(self.keys_seeded, query[i])
                self.keys_seeded += 1
                continue
            if cfg.use_sgse and self.sgse.observe(value, query[i]):
                self._expand(step)

    def _expand(self, step: int) -> None:
        try:
            self.memory.add_slot(self.sgse.new_key)
        except SlotCapacityError:
            if not self.skipped_expansions:
                warnings.warn(
                    f"MaRS: SGSE detected novel inputs but all max_slots={self.config.max_slots} slots are "
                    "in use; the expansion is skipped (raise MarsConfig.max_slots to let the memory grow). "
                    "Further skips are counted in extra_state()['skipped_expansions'].",
                    stacklevel=2,
                )
            self.skipped_expansions += 1
            return
        self.slot_history.append([step, self.memory.num_slots])

    def on_task_end(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        self.classes_trained = model.head.num_classes
        self.task_step = self.task_samples = 0

    # ---- saving ---------------------------------------------------------------------
    _COUNTERS = ("task_step", "task_samples", "task_plan", "keys_seeded", "old_classes", "classes_trained", "skipped_expansions")

    def extra_state(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in self._COUNTERS},
            "num_slots": self.memory.num_slots,
            "slot_history": self.slot_history,
            "num_anchors": len(self.anchor_slots),
            "sgse": self.sgse.state(),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        for key in self._COUNTERS:
            setattr(self, key, int(state.get(key, getattr(self, key))))
        self.slot_history = [list(x) for x in state.get("slot_history", self.slot_history)]
        self.sgse.load_state(state.get("sgse", {}))
        # Size the teacher/anchor buffers so the saved tensors load into them.
        hidden, n_old, n_anchors = self.teacher_weight.shape[1], self.old_classes, int(state.get("num_anchors", 0))
        self.teacher_weight = self.teacher_weight.new_zeros(n_old, hidden)
        self.teacher_bias = self.teacher_bias.new_zeros(n_old)
        self.anchor_slots = self.anchor_slots.new_zeros(n_anchors)
        self.anchor_means = self.anchor_means.new_zeros(n_anchors, hidden)
        self.anchor_targets = self.anchor_targets.new_zeros(n_anchors, n_old)
