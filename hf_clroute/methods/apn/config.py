"""Configs of APN (Attractor Patch Networks) and of its dense FFN-only fine-tuning counterpart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig

ADAPT_PARAMS = ("all", "ffn")
#: how a bank computes its codes: one encoder for all patches (the paper's), or one per patch
CODE_ENCODERS = ("shared", "per_patch")


@dataclass
class ApnConfig(CLConfig):
    """Routed low-rank patch FFN (APN); defaults are the paper's."""

    method: ClassVar[str] = "apn"

    num_patches: int = field(default=256, metadata={"help": "K: number of patches (and routing prototypes) per block."})
    top_k: int = field(default=4, metadata={"help": "Patches each token is routed to (softmax over these only)."})
    rank: int = field(default=32, metadata={"help": "r: width of the shared low-rank code and of each patch decoder."})
    tau: float = field(default=0.07, metadata={"help": "Temperature of the cosine routing scores."})
    gamma: float = field(default=1.0, metadata={"help": "Scale of the patch residual added to the stream."})
    load_balance_weight: float = field(
        default=0.01, metadata={"help": "Weight of the load-balancing loss on patch usage (0 = off)."}
    )
    mode: str = field(
        default="adapter",
        metadata={
            "help": "'replace': patches replace the FFN (a model trained from scratch, e.g. the char-LM; "
            "set freeze_backbone=False); 'adapter': a routed residual beside the frozen FFN of a "
            "pretrained ViT/BERT/GPT-2, starting at zero so the pretrained outputs are unchanged."
        },
    )
    target_blocks: list[int] | None = field(
        default=None,
        metadata={"help": "Indices of the blocks that get patches (negative counts from the end); None = all."},
    )
    adapt_params: str = field(
        default="all",
        metadata={
            "help": "What trains from the second task on: 'all' (everything that trained on the first task) "
            "or 'ffn' (only the patch banks, plus the classification head, which must learn new classes)."
        },
    )
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the patch residual (training only)."})
    freeze_routing_after_first_task: bool = field(
        default=False,
        metadata={
            "help": "From the second task on, the prototypes and the code encoder(s) of every bank get no "
            "gradient (frozen while each later task trains, trainable again between tasks so they are saved), "
            "so a later domain cannot move the routing partition the first domain learnt; the gates and "
            "decoders (and, with adapt_params='all', the rest of the model) still train."
        },
    )
    code_encoder: str = field(
        default="shared",
        metadata={
            "help": "'shared': one rank-r code encoder for all patches (the paper's); 'per_patch': each patch "
            "has its own d x r encoder, computed only for the tokens routed to it (one batched matmul over "
            "patches), so no encoder weight is shared between patches (K x d x r more parameters per bank)."
        },
    )
    load_balance_horizon: int = field(
        default=1,
        metadata={
            "help": "Steps the load-balancing loss averages patch usage over: 1 = this batch only (Switch-style, "
            "the default); N > 1 = a bias-corrected exponential moving average (decay 1 - 1/N) of every "
            "batch's assignment fractions, kept across tasks, so a run of single-domain batches is balanced "
            "against the usage of the last ~N steps rather than spread over all patches. "
            "load_balance_weight=0 turns balancing off."
        },
    )

    MODES: ClassVar[tuple[str, ...]] = ("replace", "adapter")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_patches", "top_k", "rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ApnConfig.{name} must be a positive integer, got {value!r}")
        self._check_positive("tau", "gamma")
        if self.top_k > self.num_patches:
            raise ValueError(f"ApnConfig.top_k ({self.top_k}) must be <= num_patches ({self.num_patches})")
        if not isinstance(self.load_balance_weight, (int, float)) or self.load_balance_weight < 0:
            raise ValueError(f"ApnConfig.load_balance_weight must be >= 0, got {self.load_balance_weight!r}")
        self._check_fraction("dropout")
        if not isinstance(self.freeze_routing_after_first_task, bool):
            raise ValueError(
                "ApnConfig.freeze_routing_after_first_task must be true or false, "
                f"got {self.freeze_routing_after_first_task!r}"
            )
        if self.code_encoder not in CODE_ENCODERS:
            raise ValueError(f"ApnConfig.code_encoder must be one of {CODE_ENCODERS}, got {self.code_encoder!r}")
        horizon = self.load_balance_horizon
        if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
            raise ValueError(f"ApnConfig.load_balance_horizon must be an integer >= 1 (steps), got {horizon!r}")
        if self.mode not in self.MODES:
            raise ValueError(f"ApnConfig.mode must be one of {self.MODES}, got {self.mode!r}")
        if self.adapt_params not in ADAPT_PARAMS:
            raise ValueError(f"ApnConfig.adapt_params must be one of {ADAPT_PARAMS}, got {self.adapt_params!r}")
        if self.target_blocks is not None and (
            not isinstance(self.target_blocks, list) or not all(isinstance(b, int) for b in self.target_blocks)
        ):
            raise ValueError(
                f"ApnConfig.target_blocks must be a list of block indices or None, got {self.target_blocks!r}")
