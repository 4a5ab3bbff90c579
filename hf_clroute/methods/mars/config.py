"""``MarsConfig``: every hyper-parameter of MaRS (SPEC section 5) as a default.

MaRS = a slot memory on a frozen encoder's pooled features (router + per-slot
affine adapters), SGSE (a statistical test that decides when to add a slot) and
DCDA (two-stage training: memory with a contrastive loss, then the head with
distillation on current inputs and on slot anchors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import CLConfig


@dataclass
class MarsConfig(CLConfig):
    method = "mars"

    # ---- slot memory ------------------------------------------------------------
    num_slots: int = field(default=32, metadata={"help": "S_0: slots the memory starts with."})
    max_slots: int = field(
        default=64,
        metadata={"help": "Cap on slots; storage for this many is allocated up front (active ones are masked in)."},
    )
    query_dim: int | None = field(
        default=None, metadata={"help": "Width of the router query q = W_q h (None: the backbone's hidden size)."}
    )
    tau_r: float = field(default=0.07, metadata={"help": "Temperature of the cosine-softmax router."})
    key_init: str = field(
        default="data",
        metadata={
            "help": "'data': the S_0 keys are the first S_0 training queries (random keys in a wide space give "
            "near-uniform routing, so no input looks familiar); 'random': seeded random unit keys."
        },
    )
    memory_init_seed: int = field(default=0, metadata={"help": "Seed for W_q (when not square) and random keys."})

    # ---- SGSE: when to add a slot --------------------------------------------------
    use_sgse: bool = field(default=True, metadata={"help": "Ablation switch: False keeps the S_0 slots fixed."})
    quantile_beta: float = field(default=0.9, metadata={"help": "beta: EMA factor of the quantile tracker Q_t."})
    quantile_window: int = field(default=10, metadata={"help": "w: recent confidences the quantile q_t is taken over."})
    quantile_eps: float = field(
        default=0.1,
        metadata={"help": "eps: Q_t tracks the level that a (1 - eps) share of recent confidences reach."},
    )
    test_trials: int = field(default=20, metadata={"help": "n: Bernoulli trials {s_t >= Q_t} per expansion test."})
    wilson_z: float = field(default=1.645, metadata={"help": "z of the one-sided Wilson lower bound (95%)."})
    alpha: float = field(
        default=0.05, metadata={"help": "Target false-expansion probability per test on a stationary stream."}
    )
    expansion_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Expand when the Wilson lower bound falls below this; None: the largest threshold whose "
            "false-expansion probability under Binomial(n, 1 - eps) is <= alpha."
        },
    )

    # ---- DCDA: how to train ----------------------------------------------------------
    dcda_schedule: str = field(
        default="alternate",
        metadata={
            "help": "'alternate': stage 1 and stage 2 take turns every dcda_window steps (online use); "
            "'sequential': per task, stage 1 on the first stage1_fraction of its samples, then stage 2 "
            "(the paper's offline recipe: stage-1 epochs, then stage-2 epochs)."
        },
    )
    dcda_window: int = field(default=10, metadata={"help": "Steps per stage turn for the 'alternate' schedule."})
    stage1_fraction: float = field(
        default=0.5, metadata={"help": "Share of a task's training samples spent in stage 1 ('sequential')."}
    )
    supcon_temperature: float = field(default=0.1, metadata={"help": "Temperature of the supervised contrastive loss."})
    lambda_smooth: float = field(default=0.3, metadata={"help": "Weight of the smoothness term mean ||h~ - LN(h)||^2."})
    distill_temperature: float = field(default=3.0, metadata={"help": "T of the LwF and anchor distillation."})
    lambda_lwf: float = field(default=1.0, metadata={"help": "Weight of LwF distillation on current inputs."})
    lambda_anchor: float = field(default=1.0, metadata={"help": "Weight of distillation on slot anchors."})
    stat_momentum: float = field(default=0.99, metadata={"help": "EMA factor of the router-weighted slot statistics."})
    varsigma: float = field(
        default=1e-3,
        metadata={"help": "Floor of the slot mass c_i in anchors mu_i / max(c_i, varsigma); lighter slots give no anchor."},
    )

    # ---- ablations ---------------------------------------------------------------------
    use_anchors: bool = field(default=True, metadata={"help": "Ablation switch: False drops anchor distillation."})
    use_stage1: bool = field(
        default=True, metadata={"help": "Ablation switch: False never trains the memory (every step is stage 2)."}
    )
    use_stage2: bool = field(
        default=True,
        metadata={"help": "Ablation switch: False trains the head with plain CE beside stage 1 (no distillation)."},
    )

    SCHEDULES: ClassVar[tuple[str, ...]] = ("alternate", "sequential")
    KEY_INITS: ClassVar[tuple[str, ...]] = ("data", "random")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError("MarsConfig.freeze_backbone must be True: MaRS adapts a frozen encoder's features")
        self._check_positive(
            "num_slots", "max_slots", "tau_r", "quantile_window", "test_trials", "wilson_z", "dcda_window",
            "supcon_temperature", "distill_temperature", "varsigma",
        )
        self._check_fraction("quantile_beta", "quantile_eps", "alpha", "stage1_fraction", "stat_momentum")
        if self.max_slots < self.num_slots:
            raise ValueError(f"MarsConfig.max_slots ({self.max_slots}) must be >= num_slots ({self.num_slots})")
        if self.query_dim is not None:
            self._check_positive("query_dim")
        for name in ("lambda_smooth", "lambda_lwf", "lambda_anchor"):
            if getattr(self, name) < 0:
                raise ValueError(f"MarsConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.dcda_schedule not in self.SCHEDULES:
            raise ValueError(f"MarsConfig.dcda_schedule must be one of {self.SCHEDULES}, got {self.dcda_schedule!r}")
        if self.key_init not in self.KEY_INITS:
            raise ValueError(f"MarsConfig.key_init must be one of {self.KEY_INITS}, got {self.key_init!r}")
        if not (self.use_stage1 or self.use_stage2):
            raise ValueError("MarsConfig.use_stage1 and use_stage2 cannot both be False (DCDA needs a stage)")
        if self.expansion_threshold is not None:
            self._check_fraction("expansion_threshold")
