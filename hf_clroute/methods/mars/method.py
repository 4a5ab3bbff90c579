"""MaRS on the CLModel hooks: slot memory + SGSE + DCDA over frozen pooled features.

Forward: h (frozen, pooled) -> memory -> h~ -> the shared incremental head g.
``out.features`` is h~ (what the head reads, in training and evaluation), so the
deep-forgetting probe measures the memory's output, not the frozen h.

DCDA trains the memory (stage 1) and the head (stage 2) in turns; a stage leaves the other group
out of the autograd graph (``grad=None``, which AdamW and SGD skip) rather than freezing it, so the
engine's one optimizer over both never moves the group a stage does not train. Stage 2 retains old
classes by distilling the task-start head on anchors: the paper's slot statistics
(``SlotStatistics``, ``AnchorBank``) or our ``class_gaussian`` per-class Gaussians
(``ClassStatistics``). SGSE adds slots while the memory trains; once no memory parameter requires a
gradient (after first-session adaptation) MaRS is a fixed function h -> h~ whose task hooks do
nothing. With ``memory='none'`` (the controls mars-memory-free and mars-prototypes) there is no
memory: the head reads LN(h), a stage-1 turn trains nothing, and the anchors, if any, are class
prototypes (``ClassPrototypes``). docs/methods/mars.md describes each part and how it reads
against the paper.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import CLModelOutput, model_inputs
from hf_clroute.heads import StatisticsHead
from hf_clroute.methods.mars.class_statistics import ClassStatistics
from hf_clroute.methods.mars.config import MarsConfig
from hf_clroute.methods.mars.prototypes import ClassPrototypes
from hf_clroute.methods.mars.sgse import (
    ExpansionTest,
    ExpansionTiming,
    expansion_timing,
)
from hf_clroute.methods.mars.slot_memory import Routing, SlotCapacityError, SlotMemory
from hf_clroute.methods.mars.slot_statistics import AnchorBank, SlotStatistics

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel
    from hf_clroute.data.experiences import Experience


def supervised_contrastive(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """SupCon (Khosla et al. 2020) over one batch; anchors without a positive are skipped."""
    z = F.normalize(features.float(), dim=-1)  # fp32 whatever the autocast: a loss
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
    """KL(teacher || student) on temperature-softened outputs, scaled by T^2 (Hinton et al.).

    ``teacher`` may cover only the first k of the student's classes (the previous head
    knew only the old ones): it then gives the other classes probability zero and the
    student's softmax runs over all of them. Writing m_new for the student's mass on the
    classes the teacher lacks and s_old for its softmax renormalised over the old ones,

        KL(teacher || student) = KL(teacher || s_old) - log(1 - m_new),

    the usual old-logit distillation plus a penalty that is zero only when the new classes
    get no mass; its gradient on every new logit is s_j / T > 0, so it pushes new-class
    logits below the old ones wherever it is applied. That is right on old-class inputs
    only, so MaRS applies the full form to old classes' anchors and the old-logit form
    (equal widths) to the current batch, whose inputs belong to the new classes.
    """
    k = teacher.shape[-1]
    log_student = F.log_softmax(student.float() / temperature, dim=-1)[:, :k]  # fp32 under any autocast
    log_teacher = F.log_softmax(teacher.float() / temperature, dim=-1)
    per_sample = (log_teacher.exp() * (log_teacher - log_student)).sum(dim=-1)
    return per_sample.mean() * temperature**2


class Mars(ContinualMethod):
    config_class = MarsConfig
    supported_modalities = ("image", "text")
    uses_head = True
    hooks_during_adaptation = True  # keys, the DCDA schedule and SGSE run on the adaptation's steps

    _COUNTERS = (
        "task_step", "task_samples", "task_plan", "keys_seeded", "old_classes", "classes_trained",
        "skipped_expansions", "steps_seen", "tasks_started", "task_keys_left", "teacher_classes",
    )
    _HISTORIES = ("slot_history", "expansion_history", "task_start_history")
    _SLOT_KEYS = ("keys_seeded", "skipped_expansions", "task_keys_left", "slot_history", "expansion_history")

    def __init__(self, config: MarsConfig) -> None:
        super().__init__(config)
        self.config: MarsConfig = config
        self.task_step = 0  # steps and (global) samples trained in the current task
        self.task_samples = 0
        self.task_plan = 0  # samples the current task will train on (for 'sequential')
        self.keys_seeded = 0  # initial slots keyed from data so far
        self.old_classes = 0  # classes the head knew before this task
        self.teacher_classes = 0  # the teacher's outputs: every head row at the task's start
        self.classes_trained = 0
        self.skipped_expansions = 0
        self.steps_seen = 0  # training steps over the whole stream
        self.tasks_started = 0
        self.task_keys_left = 0  # slots still to key from the current task's first queries
        self.slot_history: list[list[int]] = []  # [step, slots] at every growth
        self.expansion_history: list[list[int]] = []  # [step, slots] at SGSE's expansions only
        self.task_start_history: list[list[int]] = []  # [steps done before the task, task id]

    # ---- structure ------------------------------------------------------------------
    def attach(self, model: "CLModel") -> None:
        cfg = self.config
        hidden = model.spec.hidden_size(model.backbone)
        # memory='none': none of the memory's parts exist (the head reads LN(h), parameter-free).
        self.memory: SlotMemory | None = None
        self.sgse: ExpansionTest | None = None
        self.slot_stats: SlotStatistics | None = None
        self.anchor_bank: AnchorBank | None = None
        self.class_stats: ClassStatistics | None = None
        self.prototypes: ClassPrototypes | None = None
        if cfg.memory == "slots":
            self.memory = SlotMemory(
                hidden, num_slots=cfg.num_slots, max_slots=cfg.max_slots, query_dim=cfg.query_dim,
                tau=cfg.tau_r, seed=cfg.memory_init_seed,
            )
            self.sgse = ExpansionTest(
                self.memory.query.out_features, beta=cfg.quantile_beta, window=cfg.quantile_window,
                eps=cfg.quantile_eps, trials=cfg.test_trials, z=cfg.wilson_z, alpha=cfg.alpha,
                threshold=cfg.expansion_threshold, reference=cfg.reference_window,
            )
            self.slot_stats = SlotStatistics(cfg.max_slots, hidden, momentum=1 - 1 / cfg.stat_horizon)
            self.anchor_bank = AnchorBank(hidden)
        else:
            self.norm = nn.LayerNorm(hidden, elementwise_affine=False)  # what a fresh slot memory outputs
        if cfg.memory == "slots" or cfg.anchors == "class_gaussian":
            self.class_stats = ClassStatistics(hidden)
        if cfg.anchors == "class_prototype":
            self.prototypes = ClassPrototypes(hidden)
        if cfg.key_init == "random":
            self.keys_seeded = cfg.num_slots
        # Teacher (the head before this task); resized at task start and in load_extra_state,
        # saved with the adapter like any buffer.
        self.register_buffer("teacher_weight", torch.zeros(0, hidden))
        self.register_buffer("teacher_bias", torch.zeros(0))
        self.slot_history = [[0, self.memory.num_slots]] if self.memory is not None else []

    # ---- fixed after first-session adaptation ---------------------------------------------
    @property
    def fixed(self) -> bool:
        """True once nothing of the memory trains (first-session adaptation froze it): the forward
        only maps h -> h~ -> head and the task hooks do nothing. Never without a memory."""
        return self.memory is not None and not any(p.requires_grad for p in self.memory.parameters())

    def memory_output(self, h: torch.Tensor) -> torch.Tensor:
        """h~, what the head reads: the slot memory's output, or LN(h) without a memory."""
        return self.norm(h) if self.memory is None else self.memory(h).output

    def _check_dcda_head(self, model: "CLModel") -> None:
        """DCDA reads and trains the linear head; refuse a statistics head while the memory trains."""
        if isinstance(model.head, StatisticsHead):
            raise ValueError(
                f"MaRS trains its memory through the linear head (DCDA), not the {self.config.head!r} head: with "
                "a statistics head the memory trains only in first-session adaptation (MarsConfig.adaptation, "
                "which swaps in a linear head) and must be frozen after it"
            )

    # ---- stages ---------------------------------------------------------------------
    def stage(self) -> int:
        """1 (memory) or 2 (head) for the next training step."""
        cfg = self.config
        if not cfg.use_stage1:
            return 2
        if not cfg.use_stage2:
            return 1
        if cfg.dcda_schedule == "alternate":  # one stage-1 turn, then stage2_ratio stage-2 turns
            return 1 if (self.task_step // cfg.dcda_window) % (1 + cfg.stage2_ratio) == 0 else 2
        return 1 if self.task_samples < cfg.stage1_fraction * self.task_plan else 2

    # ---- forward ---------------------------------------------------------------------
    def forward(self, model: "CLModel", batch: dict[str, torch.Tensor]) -> CLModelOutput:
        """h -> memory -> h~ -> head; in training the stage's loss, and what ``after_step``
        folds into the class statistics and SGSE (in ``features`` and ``extras``). In evaluation,
        or once the memory is fixed (frozen after first-session adaptation), only the logits and
        ``features`` = h~ (what a statistics head accumulates)."""
        h = self.features(model, model_inputs(batch))
        if self.fixed or not self.training or "labels" not in batch:
            out_h = self.memory_output(h)
            return CLModelOutput(logits=model.head(out_h), features=out_h.detach())
        self._check_dcda_head(model)
        stage = self.stage()
        if self.memory is None:
            return self._forward_memory_free(model, batch, h, stage)
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
            outputs, normed, contrasted = routing.output, routing.normed, labels
            drawn = self.anchor_samples(model, h) if self.config.rehearse_memory else None
            if drawn is not None:  # anchors of every seen class, routed with gradient
                anchor_routing = self.memory(drawn[0])
                outputs = torch.cat([outputs, anchor_routing.output])
                normed = torch.cat([normed, anchor_routing.normed])
                contrasted = torch.cat([labels, drawn[1]])
            losses = {"supcon": supervised_contrastive(outputs, contrasted, self.config.supcon_temperature)}
            if not self.config.use_stage2:
                losses["ce"] = self.loss(model, batch, logits)
            smooth = (outputs - normed).pow(2).sum(dim=-1).mean()
            losses["smooth"] = self.config.lambda_smooth * smooth
        novelty = {"top_similarity": routing.similarity, "energy": routing.energy}.get(
            self.config.novelty_statistic, routing.confidence)
        extras = {
            "query": routing.query.detach(), "confidence": novelty.detach(),
            "probs": routing.probs.detach(), "normed": routing.normed.detach(),
        }
        if self.config.class_stats_space == "backbone":
            extras["backbone"] = h.detach()
        return CLModelOutput(
            loss=sum(losses.values()), logits=logits, losses=losses, features=routing.output.detach(), extras=extras
        )

    def _forward_memory_free(self, model: "CLModel", batch: dict[str, torch.Tensor], h: torch.Tensor,
                             stage: int) -> CLModelOutput:
        """memory='none': the head reads LN(h). Stage 2 is the same loss as with the memory; a stage-1
        turn has no memory to train, so nothing enters the graph but a zero loss (no parameter gets a
        gradient and the optimizer skips them all): the head moves on exactly the steps it moves on
        with the memory. Without stage 2 (ablation) the head learns by plain CE on every step."""
        normed = self.norm(h)
        extras = {"normed": normed.detach()}
        if self.config.class_stats_space == "backbone":
            extras["backbone"] = h.detach()
        if stage == 2:
            logits = model.head(normed)
            losses = {"ce": self.loss(model, batch, logits), **self.stage2_losses(model, normed, logits)}
        elif not self.config.use_stage2:
            logits = model.head(normed)
            losses = {"ce": self.loss(model, batch, logits)}
        else:
            with torch.no_grad():
                logits = model.head(normed)
            losses = {"idle": normed.new_zeros((), dtype=torch.float32, requires_grad=True)}
        return CLModelOutput(loss=sum(losses.values()), logits=logits, losses=losses, features=normed.detach(),
                             extras=extras)

    def stage2_losses(self, model: "CLModel", routing: Routing | torch.Tensor,
                      logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """LwF on the current inputs (``routing``: the memory's pass, or h~ itself, what the head reads);
        distillation on the slot anchors or the banked class prototypes, or alignment and distillation
        on anchors drawn from the class Gaussians."""
        output = routing.output if isinstance(routing, Routing) else routing
        cfg, n_old, T = self.config, self.old_classes, self.config.distill_temperature
        terms = {}
        if n_old and cfg.lambda_lwf:
            all_outputs = cfg.full_output_consistency == "anchors_and_lwf"
            terms["lwf"] = cfg.lambda_lwf * self.consistency(logits, output, all_outputs)
        if not cfg.use_anchors:
            return terms
        if cfg.anchors in ("slot", "class_prototype"):
            anchors = self.slot_anchors() if cfg.anchors == "slot" else self.prototypes.anchors().to(output)
            if n_old and cfg.lambda_anchor and len(anchors):
                all_outputs = cfg.full_output_consistency != "none"
                terms["anchor"] = cfg.lambda_anchor * self.consistency(model.head(anchors), anchors, all_outputs)
            return terms
        drawn = self.draw_anchors(model, output)
        if drawn is None:
            return terms
        anchors, labels = drawn
        anchor_logits = model.head(anchors)
        if cfg.lambda_align:
            terms["align"] = cfg.lambda_align * F.cross_entropy(anchor_logits, labels)
        old = labels < n_old
        if n_old and cfg.lambda_anchor and bool(old.any()):
            teacher = F.linear(anchors[old], self.teacher_weight[:n_old], self.teacher_bias[:n_old])
            student = anchor_logits[old] if cfg.bound_new_classes else anchor_logits[old][:, :n_old]
            terms["anchor"] = cfg.lambda_anchor * distillation(student, teacher, T)
        return terms

    def consistency(self, student: torch.Tensor, inputs: torch.Tensor, all_outputs: bool) -> torch.Tensor:
        """Distillation from the head as it was at the task's start on ``inputs`` (the head's
        input space): over the old classes' logits, or over every output the teacher has (the
        new classes' rows as grown), which is zero exactly when the head has not moved."""
        n = self.teacher_classes if all_outputs else self.old_classes
        teacher = F.linear(inputs, self.teacher_weight[:n], self.teacher_bias[:n])
        return distillation(student[:, :n], teacher, self.config.distill_temperature)

    @torch.no_grad()
    def slot_anchors(self) -> torch.Tensor:
        """The slot anchors with the adapters as they are now (stage 2 does not train them): one per
        active slot with live statistics ('ema', the paper's), or one per banked slot mean: (A, d)."""
        memory = self.memory
        if self.config.anchor_memory != "ema":
            return self.anchor_bank.anchors(memory.gamma, memory.beta)
        return self.slot_stats.anchors(memory.gamma, memory.beta, memory.active_mask(), self.config.varsigma)

    def _bank_anchors(self) -> None:
        """Keep the current segment's slot means as anchors and restart the statistics."""
        self.anchor_bank.snapshot(self.slot_stats, self.memory.active_mask(), self.config.varsigma)

    @torch.no_grad()
    def anchor_samples(self, model: "CLModel", like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``anchors_per_class`` draws from the Gaussian of every seen class with a head row, in
        the statistics' own space (h~ or frozen h), and their labels; None before any feature.

        The generator is seeded by the run seed and the step, so a resumed run draws the same
        anchors as one that never stopped, and the global RNG stream (data order) is untouched."""
        cfg = self.config
        classes = self.class_stats.seen()
        classes = classes[classes < model.head.num_classes]
        if not len(classes):
            return None
        generator = torch.Generator().manual_seed(cfg.memory_init_seed * 1_000_003 + self.steps_seen)
        samples, labels = self.class_stats.sample(classes, cfg.anchors_per_class, cfg.covariance_shrinkage, generator)
        return samples.to(like), labels.to(like.device)

    @torch.no_grad()
    def draw_anchors(self, model: "CLModel", like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Anchors as the head reads them (h~) and their labels: samples of h~ as drawn, or samples
        of the frozen h routed through the memory as it is now."""
        drawn = self.anchor_samples(model, like)
        if drawn is None or self.config.class_stats_space == "memory_output":
            return drawn
        return self.memory_output(drawn[0]), drawn[1]

    # ---- hooks -----------------------------------------------------------------------
    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        if self.fixed:  # a frozen memory: no teacher, no statistics, nothing to plan
            return
        self._check_dcda_head(model)
        if self.task_step:  # resumed mid-task: counters and teacher came from the checkpoint
            return
        self.task_plan = len(experience.train) * ctx.epochs
        self.old_classes = self.classes_trained
        if self.class_stats is not None:
            self.class_stats.resize(model.head.num_classes)
        self.tasks_started += 1
        if self.config.anchor_memory == "task_start" and self.tasks_started > 1 and self.memory is not None:
            self._bank_anchors()  # the previous tasks' inputs, as the slots saw them
        if self.prototypes is not None and self.tasks_started > 1:
            self.prototypes.bank()  # every class seen before this task, one mean each
        self.task_keys_left = self.config.keys_per_task if self.tasks_started > 1 else 0
        self.task_start_history.append([ctx.global_step, ctx.task_id])
        self._snapshot_teacher(model)

    @torch.no_grad()
    def _snapshot_teacher(self, model: "CLModel") -> None:
        """Keep the head as it was before this task: every row, the new classes' as grown."""
        n = self.teacher_classes = model.head.num_classes
        self.teacher_weight = model.head.weight[:n].detach().clone()
        self.teacher_bias = model.head.bias[:n].detach().clone()

    @torch.no_grad()
    def after_step(self, model: "CLModel", batch, out: CLModelOutput, ctx: StepContext) -> None:
        if self.fixed:  # no slot growth (a frozen memory cannot train a new slot), no statistics
            return
        if self.memory is not None:
            self.slot_stats.update(ctx.gather(out.extras["normed"]).float(), ctx.gather(out.extras["probs"]).float())
        labels = ctx.gather(batch["labels"]) if self.memory is None or self.config.anchors == "class_gaussian" else None
        if self.config.anchors == "class_gaussian":
            space = out.extras["backbone"] if self.config.class_stats_space == "backbone" else out.features
            self.class_stats.update(ctx.gather(space).float(), labels)
        if self.prototypes is not None:
            self.prototypes.update(ctx.gather(out.extras["normed"]).float(), labels)
        if self.memory is not None:
            query, confidence = (ctx.gather(out.extras[k]).float() for k in ("query", "confidence"))
            self._observe(query, confidence, ctx.global_step + 1)
        self.task_step += 1
        self.task_samples += len(confidence) if self.memory is not None else len(labels)
        self.steps_seen += 1

    def _observe(self, query: torch.Tensor, confidence: torch.Tensor, step: int) -> None:
        """Key the initial slots from the first queries (and, with keys_per_task, a task's new
        slots from its first queries); feed every other input to SGSE."""
        cfg = self.config
        for i, value in enumerate(confidence.tolist()):  # one device sync per step, not per input
            if self.keys_seeded < cfg.num_slots:
                self.memory.set_key(self.keys_seeded, query[i])
                self.keys_seeded += 1
            elif self.task_keys_left:
                self.task_keys_left -= 1
                if self._add_slot(query[i], step):
                    # The routing mass is redistributed: SGSE's level no longer describes it.
                    self.sgse.relearn_level()
            elif cfg.use_sgse and self.sgse.observe(value, query[i]):
                if cfg.anchor_memory == "expansion":  # before the shift: what the slots have seen so far
                    self._bank_anchors()
                if self._add_slot(self.sgse.new_key, step):
                    self.expansion_history.append([step, self.memory.num_slots])

    def _add_slot(self, key: torch.Tensor, step: int) -> bool:
        try:
            self.memory.add_slot(key)
        except SlotCapacityError:
            if not self.skipped_expansions:
                warnings.warn(
                    f"MaRS: a new slot was due but all max_slots={self.config.max_slots} slots are "
                    "in use; it is skipped (raise MarsConfig.max_slots to let the memory grow). "
                    "Further skips are counted in extra_state()['skipped_expansions'].",
                    stacklevel=2,
                )
            self.skipped_expansions += 1
            return False
        self.slot_history.append([step, self.memory.num_slots])
        return True

    def on_task_end(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        if self.fixed:
            return
        self.classes_trained = model.head.num_classes
        self.task_step = self.task_samples = 0

    def sgse_timing(self, window: int | None = None) -> ExpansionTiming | None:
        """SGSE's expansions against the task boundaries after the first (None before any step)."""
        if not self.steps_seen or self.memory is None:
            return None
        boundaries = [step for step, _ in self.task_start_history[1:]]
        expansions = [step for step, _ in self.expansion_history]
        return expansion_timing(expansions, boundaries, self.steps_seen, window or self.config.timing_window)

    # ---- saving ---------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in (*self._COUNTERS, *self._HISTORIES)
                 if self.memory is not None or k not in self._SLOT_KEYS}
        if self.memory is not None:
            timing = self.sgse_timing()
            state.update({
                "num_slots": self.memory.num_slots, "banked_anchors": len(self.anchor_bank), "sgse": self.sgse.state(),
                "sgse_timing": dataclasses.asdict(timing) if timing else None,
            })
        if self.class_stats is not None:
            state["stat_classes"] = self.class_stats.num_classes
        if self.prototypes is not None:
            state.update(prototype_classes=self.prototypes.num_classes, banked_prototypes=len(self.prototypes))
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        for key in self._COUNTERS:
            setattr(self, key, int(state.get(key, getattr(self, key))))
        for key in self._HISTORIES:
            setattr(self, key, [list(x) for x in state.get(key, getattr(self, key))])
        if self.sgse is not None:
            self.sgse.load_state(state.get("sgse", {}))
        # Size the teacher and statistics buffers so the saved tensors load into them.
        # (An adapter saved before teacher_classes existed kept the old classes' rows only.)
        hidden = self.teacher_weight.shape[1]
        n_teacher = int(state.get("teacher_classes", self.old_classes))
        self.teacher_classes = n_teacher
        self.teacher_weight = self.teacher_weight.new_zeros(n_teacher, hidden)
        self.teacher_bias = self.teacher_bias.new_zeros(n_teacher)
        if self.anchor_bank is not None:
            self.anchor_bank.resize(int(state.get("banked_anchors", 0)))
        if self.class_stats is not None:
            self.class_stats.resize(int(state.get("stat_classes", 0)))
        if self.prototypes is not None:
            self.prototypes.resize(int(state.get("prototype_classes", 0)), int(state.get("banked_prototypes", 0)))
