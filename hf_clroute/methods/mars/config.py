"""``MarsConfig``: every hyper-parameter of MaRS as a default.

MaRS = a slot memory on a frozen encoder's pooled features (router + per-slot
affine adapters), SGSE (a statistical test that decides when to add a slot) and
DCDA (two-stage training: memory with a contrastive loss, then the head with
distillation on current inputs and on anchors).

MaRS trains through the shared linear head (``head='linear'``, the default). A statistics head
(``head='lda'``, ``'ranpac'`` or ``'prototype'``, ours: ``mars-fsa-slda``) is accepted only with
first-session adaptation (``adaptation``): the memory trains before the stream with a temporary
linear head, then stays frozen while the statistics head reads its output h~.

The options added to read the paper's theory more closely (the mars row sets the values chosen on
validation; the dataclass defaults keep the first literal reading, row mars-paper):
``full_output_consistency`` (Theorem 2 bounds the old classes' accuracy only if the anchors' whole
prediction stays consistent), ``anchor_memory`` (anchors that keep representing old data),
``reference_window`` with ``novelty_statistic`` (an SGSE test calibrated against a reference window,
so a shift is tested against the distribution before it) and ``stage2_ratio`` (the classifier's
share of the steps).

Defaults are the paper's unless a field's help says "ours". Two of our designs
are variants with their own names, not defaults: slot keys seeded at every task
start (``keys_per_task > 0``, ``mars-task-keys``: the paper grows the memory
through SGSE alone, task-free) and class-Gaussian anchors with class-balanced
alignment (``anchors="class_gaussian"``, ``mars-gaussian-align``: the paper's
anchors are per-slot statistics).

Two controls take the memory away and keep the head, its loss and its steps: ``memory="none"``
(``mars-memory-free``: the head reads LN(h), no router, slots or anchors) and, on top of it,
``anchors="class_prototype"`` (``mars-prototypes``: distillation on class means banked at task
starts, what the slot anchors become once no router spreads them over slots).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class MarsConfig(CLConfig):
    method: ClassVar[str] = "mars"

    # ---- slot memory ------------------------------------------------------------
    memory: str = field(
        default="slots",
        metadata={
            "help": "'slots' (the paper's): the slot memory (router, per-slot adapters, slot statistics, "
            "SGSE). 'none' (ours, the memory-free control mars-memory-free): no router, slot, slot statistic, "
            "adapter or SGSE; the head reads LN(h), the frozen features' LayerNorm, which is what a fresh slot "
            "memory outputs. The DCDA schedule is kept as it is: a stage-1 turn trains nothing (no parameter "
            "gets a gradient), so the head trains on exactly the steps it trains on with the slot memory. "
            "Needs use_sgse=False and anchors other than 'slot' (or use_anchors=False)."
        },
    )
    num_slots: int = field(default=32, metadata={"help": "S_0: slots the memory starts with (the paper's 32)."})
    max_slots: int = field(
        default=64,
        metadata={"help": "Cap on slots (ours: the paper sets none); storage for this many is allocated up "
                          "front (active ones are masked in), so it must leave SGSE room to grow."},
    )
    query_dim: int | None = field(
        default=None,
        metadata={"help": "Width of the router query q = W_q h (None, ours: the backbone's hidden size, so W_q "
                          "starts as the identity and routes on h itself)."},
    )
    tau_r: float = field(default=0.07, metadata={"help": "Temperature of the cosine-softmax router (the paper's)."})
    key_init: str = field(
        default="data",
        metadata={
            "help": "'data' (ours; the paper does not say): the S_0 keys are the first S_0 training queries "
            "(random keys in a wide space give near-uniform routing, so no input looks familiar); 'random': "
            "seeded random unit keys."
        },
    )
    memory_init_seed: int = field(default=0, metadata={"help": "Seed for W_q (when not square) and random keys."})

    # ---- SGSE: when to add a slot --------------------------------------------------
    use_sgse: bool = field(
        default=True, metadata={"help": "Ablation switch (True is the paper's): False keeps the S_0 slots fixed."}
    )
    novelty_statistic: str = field(
        default="top_probability",
        metadata={
            "help": "What SGSE tests per input. 'top_probability': s = max_i p_i, the top-slot router "
            "confidence (the paper's); it is relative (a softmax over cosines), so an input far from every "
            "key can still be routed confidently when one key is slightly less far than the others. "
            "'top_similarity': max_i cos(q, k_i), how close the nearest key is, which drops for any input "
            "no slot covers. 'energy' (ours): tau_r * logsumexp_i(cos(q, k_i) / tau_r), minus the router's "
            "free energy: a smooth maximum of the similarities that also counts how many keys are near."
        },
    )
    reference_window: int = field(
        default=0,
        metadata={
            "help": "0 (the paper's): SGSE compares each input with the tracked level Q_t (quantile_beta, "
            "quantile_window), which follows the stream within about one batch. R > 0 (ours): with the "
            "eps-quantile of the last R inputs' statistics before the test block, fixed for the block; on a "
            "stationary stream a block's failures are then exactly BetaBinomial(n, k, R + 1 - k), "
            "k = floor(eps (R + 1)), and the threshold from that law bounds the false-expansion probability "
            "per test by alpha for any statistic; a shift is tested against the old distribution for R inputs."
        },
    )
    quantile_beta: float = field(
        default=0.9, metadata={"help": "beta: EMA factor of the quantile tracker Q_t (the paper's)."}
    )
    quantile_window: int = field(
        default=10, metadata={"help": "w: recent confidences the quantile q_t is taken over (the paper's)."}
    )
    quantile_eps: float = field(
        default=0.1,
        metadata={"help": "eps: Q_t tracks the level that a (1 - eps) share of recent confidences reach "
                          "(the paper's)."},
    )
    test_trials: int = field(
        default=20, metadata={"help": "n: Bernoulli trials {s_t >= Q_t} per expansion test (the paper's)."}
    )
    wilson_z: float = field(
        default=1.645, metadata={"help": "z of the one-sided Wilson lower bound (95%, the paper's)."}
    )
    alpha: float = field(
        default=0.05,
        metadata={"help": "Target false-expansion probability per test on a stationary stream (the paper bounds "
                          "it by alpha; 0.05 is ours)."},
    )
    expansion_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Expand when the Wilson lower bound falls below this; None (ours, the paper gives no "
            "value): the largest threshold whose false-expansion probability under Binomial(n, 1 - eps) is "
            "<= alpha."
        },
    )

    # ---- DCDA: how to train ----------------------------------------------------------
    dcda_schedule: str = field(
        default="alternate",
        metadata={
            "help": "'alternate' (ours, for online use: the paper trains offline, which an online stream "
            "cannot): stage 1 and stage 2 take turns every dcda_window steps; 'sequential': per task, "
            "stage 1 on the first stage1_fraction of its samples, then stage 2 (the paper's offline recipe: "
            "stage-1 epochs, then stage-2 epochs)."
        },
    )
    dcda_window: int = field(
        default=10, metadata={"help": "Steps per stage turn for the 'alternate' schedule (ours)."}
    )
    stage2_ratio: int = field(
        default=1,
        metadata={
            "help": "'alternate' only (ours): stage-2 turns per stage-1 turn. 1 gives the head every other "
            "turn; r gives it r / (r + 1) of the steps, as much as the classifier of a head-only control "
            "gets minus one turn in r + 1 (the paper trains each stage to convergence offline)."
        },
    )
    stage1_fraction: float = field(
        default=0.5,
        metadata={"help": "Share of a task's training samples spent in stage 1 ('sequential'; ours: the paper "
                          "states epochs, not a share)."},
    )
    supcon_temperature: float = field(
        default=0.1,
        metadata={"help": "Temperature of the supervised contrastive loss (ours: SupCon's usual 0.1; the paper "
                          "states none)."},
    )
    lambda_smooth: float = field(
        default=0.3, metadata={"help": "Weight of the smoothness term mean ||h~ - LN(h)||^2 (the paper's 0.3)."}
    )
    distill_temperature: float = field(
        default=3.0, metadata={"help": "T of the LwF and anchor distillation (the paper's T = 3)."}
    )
    lambda_lwf: float = field(
        default=1.0,
        metadata={"help": "Weight of LwF distillation (old classes' logits) on current inputs; the paper's loss is "
                          "an unweighted sum, so 1."},
    )

    # ---- anchors -----------------------------------------------------------------------
    anchors: str = field(
        default="slot",
        metadata={
            "help": "What stage 2 distils on besides the current inputs. 'slot' (the paper's): one anchor per "
            "slot, a_i = gamma_i * (mu_i / max(c_i, varsigma)) + beta_i from router-weighted EMA statistics "
            "(mu_i, c_i) of the memory's inputs, with distillation from the previous head over the old "
            "classes' logits. 'class_gaussian' (ours, variant mars-gaussian-align): draws from exact running "
            "per-class Gaussians, with class-balanced alignment and distillation (the class_stats_space ... "
            "rehearse_memory fields below apply to it only). 'class_prototype' (ours, control "
            "mars-prototypes; needs memory='none'): one prototype per class, the exact mean of the head's "
            "inputs LN(h) over the class's training samples, banked at each later task's start for every "
            "class seen before it, with the slot anchors' distillation (lambda_anchor, the outputs "
            "full_output_consistency names) from the head as it was at that start."
        },
    )
    full_output_consistency: str = field(
        default="none",
        metadata={
            "help": "Which outputs stage 2's distillation keeps consistent with the head as it was at the task's "
            "start (the teacher, all its rows, the new classes' freshly grown ones included). 'none': the old "
            "classes' logits only, on the anchors and on the current inputs (nothing bounds the new classes' "
            "logits on old inputs). 'anchors': the slot anchors over every output, the consistency the paper's "
            "Theorem 2 assumes (old-class accuracy is bounded only if the anchors' whole prediction stays within "
            "eta); LwF on the current inputs stays on the old logits, since those inputs belong to the new "
            "classes. 'anchors_and_lwf': both over every output (the current inputs' new-class outputs are "
            "then also pulled towards their initial values). Slot anchors and class prototypes (class_gaussian "
            "has bound_new_classes)."
        },
    )
    anchor_memory: str = field(
        default="ema",
        metadata={
            "help": "Which slot anchors stage 2 uses. 'ema' (the paper's statistics, read live): the per-slot "
            "EMA, which follows the current task (horizon stat_horizon steps), so the anchors stop representing "
            "old data. 'task_start' (ours): at each later task's start every used slot's mean input is banked "
            "and the statistics restart, so the anchors keep one entry per slot and past task (the teacher is "
            "taken at the same boundary). 'expansion' (ours, task-free): banked at each SGSE expansion instead. "
            "A banked anchor is rebuilt with its slot's current adapter, a = gamma_i * m + beta_i. Slot anchors "
            "only."
        },
    )
    stat_horizon: int = field(
        default=100,
        metadata={
            "help": "The per-slot EMA statistics (anchors='slot') average over about this many steps: "
            "c_i <- m c_i + (1 - m) mean p_i with m = 1 - 1 / stat_horizon. The paper uses an EMA without "
            "a stated factor; 100 (m = 0.99) is ours, tuned on validation (mars.json's search points)."
        },
    )
    varsigma: float = field(
        default=1e-3,
        metadata={
            "help": "Floor of the slot mass in a_i = gamma_i * (mu_i / max(c_i, varsigma)) + beta_i (the paper's "
            "formula; the value is ours): a barely used slot's anchor shrinks towards beta_i instead of "
            "dividing by almost zero."
        },
    )
    class_stats_space: str = field(
        default="memory_output",
        metadata={
            "help": "anchors='class_gaussian' only. Which features the per-class Gaussians (exact running "
            "means + one shared covariance) describe. 'memory_output': h~ as the head saw it in training "
            "(samples go to the head as they are; old classes' statistics describe the memory as it was "
            "then); 'backbone': the frozen h (never stale), and each sample is routed through the current "
            "memory to give its h~."
        },
    )
    anchors_per_class: int = field(
        default=16,
        metadata={"help": "anchors='class_gaussian' only: samples drawn per seen class from its Gaussian at "
                          "every stage-2 step."},
    )
    covariance_shrinkage: float = field(
        default=0.1,
        metadata={
            "help": "anchors='class_gaussian' only: s in (1 - s) Sigma + s (tr Sigma / d) I, the covariance "
            "the anchors are drawn with: keeps it positive definite while it is estimated from fewer "
            "features than dimensions."
        },
    )
    lambda_align: float = field(
        default=1.0,
        metadata={
            "help": "anchors='class_gaussian' only: weight of classifier alignment, cross-entropy over every "
            "seen class on the anchors of every seen class (class-balanced, so the head sees old and new "
            "classes equally often)."
        },
    )
    lambda_anchor: float = field(
        default=1.0,
        metadata={"help": "Weight of distillation from the previous head on the anchors (slot anchors, or the old "
                          "classes' Gaussian anchors); the paper's loss is an unweighted sum, so 1."},
    )
    bound_new_classes: bool = field(
        default=True,
        metadata={
            "help": "anchors='class_gaussian' only (slot anchors carry no label, so their distillation is "
            "always over the old classes' logits, the paper's). True: the anchor distillation is KL over all "
            "the head's classes, the previous head giving the new classes zero probability, which adds "
            "-log(1 - new-class mass) and so holds new-class logits below old ones on old-class anchors; "
            "False: KL over old classes' logits only."
        },
    )
    rehearse_memory: bool = field(
        default=False,
        metadata={
            "help": "anchors='class_gaussian' only (ours). Stage 1 also contrasts the anchors of every seen "
            "class (drawn as frozen h and routed through the memory with gradient), so the memory is "
            "trained to separate all classes seen, not only the current batch's; needs "
            "class_stats_space='backbone'."
        },
    )
    keys_per_task: int = field(
        default=0,
        metadata={
            "help": "0 (the paper's): after the num_slots initial keys, only SGSE adds slots, so the memory "
            "grows without being told where tasks begin. > 0 (ours, variant mars-task-keys): this many slots "
            "switched on at each later task's start, keyed by that task's first queries, so keys cover the "
            "whole stream; it uses the task boundaries SGSE is meant to detect on its own."
        },
    )
    timing_window: int = field(
        default=10,
        metadata={
            "help": "Measurement only (ours): an SGSE expansion within this many steps after a task boundary counts "
            "as detecting it (extra_state()['sgse_timing'])."
        },
    )

    # ---- ablations ---------------------------------------------------------------------
    use_anchors: bool = field(
        default=True,
        metadata={"help": "Ablation switch (True is the paper's): False uses no anchors (no anchor "
                          "distillation, no alignment)."},
    )
    use_stage1: bool = field(
        default=True,
        metadata={"help": "Ablation switch (True is the paper's): False never trains the memory (every step is "
                          "stage 2)."},
    )
    use_stage2: bool = field(
        default=True,
        metadata={"help": "Ablation switch (True is the paper's): False trains the head with plain CE beside "
                          "stage 1 (no distillation)."},
    )

    SCHEDULES: ClassVar[tuple[str, ...]] = ("alternate", "sequential")
    KEY_INITS: ClassVar[tuple[str, ...]] = ("data", "random")
    NOVELTY_STATISTICS: ClassVar[tuple[str, ...]] = ("top_probability", "top_similarity", "energy")
    STATS_SPACES: ClassVar[tuple[str, ...]] = ("memory_output", "backbone")
    ANCHORS: ClassVar[tuple[str, ...]] = ("slot", "class_gaussian", "class_prototype")
    MEMORIES: ClassVar[tuple[str, ...]] = ("slots", "none")
    CONSISTENCY: ClassVar[tuple[str, ...]] = ("none", "anchors", "anchors_and_lwf")
    ANCHOR_MEMORIES: ClassVar[tuple[str, ...]] = ("ema", "task_start", "expansion")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError("MarsConfig.freeze_backbone must be True: MaRS adapts a frozen encoder's features")
        # DCDA reads and trains the linear head (stage 1 its weights, stage 2 its outputs), so a statistics
        # head can only read a memory that first-session adaptation trained (with a temporary linear head)
        # and froze. (CLConfig already refuses adaptation with the linear head.)
        if self.head != "linear" and self.adaptation is None:
            raise ValueError(
                f"MarsConfig.head={self.head!r} needs MarsConfig.adaptation "
                "(e.g. {'on': 'first_task', 'epochs': 5}): "
                "MaRS's DCDA trains the memory through the linear head, so a statistics head reads only a memory "
                "trained by first-session adaptation and frozen after it; otherwise leave head='linear'"
            )
        if self.memory not in self.MEMORIES:
            raise ValueError(f"MarsConfig.memory must be one of {self.MEMORIES}, got {self.memory!r}")
        if self.memory == "none":
            self._check_memory_free()
        elif self.anchors == "class_prototype":
            raise ValueError("MarsConfig.anchors='class_prototype' needs memory='none': the prototypes are means of "
                             "the head's inputs, which a trained slot memory would move away from them")
        if self.adaptation is not None and not self.use_stage1:
            raise ValueError("MarsConfig.adaptation trains the memory, which use_stage1=False never trains "
                             "(stage 2 runs the memory without gradient)")
        self._check_positive(
            "num_slots", "max_slots", "tau_r", "quantile_window", "test_trials", "wilson_z", "dcda_window",
            "supcon_temperature", "distill_temperature", "anchors_per_class", "timing_window", "varsigma",
            "stat_horizon", "stage2_ratio",
        )
        self._check_fraction(
            "quantile_beta", "quantile_eps", "alpha", "stage1_fraction", "covariance_shrinkage"
        )
        if self.stat_horizon < 1:
            raise ValueError(f"MarsConfig.stat_horizon must be >= 1 step, got {self.stat_horizon!r}")
        if self.max_slots < self.num_slots:
            raise ValueError(f"MarsConfig.max_slots ({self.max_slots}) must be >= num_slots ({self.num_slots})")
        if self.query_dim is not None:
            self._check_positive("query_dim")
        for name in ("lambda_smooth", "lambda_lwf", "lambda_align", "lambda_anchor", "keys_per_task"):
            if getattr(self, name) < 0:
                raise ValueError(f"MarsConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.dcda_schedule not in self.SCHEDULES:
            raise ValueError(f"MarsConfig.dcda_schedule must be one of {self.SCHEDULES}, got {self.dcda_schedule!r}")
        if self.class_stats_space not in self.STATS_SPACES:
            raise ValueError(
                f"MarsConfig.class_stats_space must be one of {self.STATS_SPACES}, got {self.class_stats_space!r}"
            )
        if self.anchors not in self.ANCHORS:
            raise ValueError(f"MarsConfig.anchors must be one of {self.ANCHORS}, got {self.anchors!r}")
        if self.rehearse_memory and self.anchors != "class_gaussian":
            raise ValueError("MarsConfig.rehearse_memory needs anchors='class_gaussian' (slot anchors carry no label)")
        if self.rehearse_memory and self.class_stats_space != "backbone":
            raise ValueError(
                "MarsConfig.rehearse_memory needs class_stats_space='backbone' (anchors routed with gradient)")
        if self.novelty_statistic not in self.NOVELTY_STATISTICS:
            raise ValueError(
                f"MarsConfig.novelty_statistic must be one of {self.NOVELTY_STATISTICS}, got {self.novelty_statistic!r}"
            )
        if self.full_output_consistency not in self.CONSISTENCY:
            raise ValueError(f"MarsConfig.full_output_consistency must be one of {self.CONSISTENCY}, "
                             f"got {self.full_output_consistency!r}")
        if self.anchor_memory not in self.ANCHOR_MEMORIES:
            raise ValueError(
                f"MarsConfig.anchor_memory must be one of {self.ANCHOR_MEMORIES}, got {self.anchor_memory!r}")
        if self.reference_window < 0:
            raise ValueError(
                f"MarsConfig.reference_window must be >= 0 (0: the tracked level), got {self.reference_window!r}")
        if self.reference_window and self.quantile_eps * (self.reference_window + 1) < 1:
            raise ValueError(f"MarsConfig.reference_window={self.reference_window} is too short for quantile_eps="
                             f"{self.quantile_eps}: the eps-quantile needs eps * (R + 1) >= 1")
        if self.key_init not in self.KEY_INITS:
            raise ValueError(f"MarsConfig.key_init must be one of {self.KEY_INITS}, got {self.key_init!r}")
        if not (self.use_stage1 or self.use_stage2):
            raise ValueError("MarsConfig.use_stage1 and use_stage2 cannot both be False (DCDA needs a stage)")
        if self.expansion_threshold is not None:
            self._check_fraction("expansion_threshold")

    def _check_memory_free(self) -> None:
        """memory='none' has no router, slot or adapter: refuse the options that need one."""
        needs = {
            "use_sgse": (self.use_sgse, "False (SGSE adds slots)"),
            "anchors": (self.use_anchors and self.anchors == "slot",
                        "'class_prototype' or 'class_gaussian', or use_anchors=False (slot anchors need slots)"),
            "keys_per_task": (self.keys_per_task > 0, "0 (it keys slots)"),
            "rehearse_memory": (self.rehearse_memory, "False (it trains the memory)"),
            "adaptation": (self.adaptation is not None, "None (there is no memory to adapt)"),
        }
        for name, (bad, wanted) in needs.items():
            if bad:
                raise ValueError(f"MarsConfig.memory='none' needs MarsConfig.{name}={wanted}, "
                                 f"got {getattr(self, name)!r}")
