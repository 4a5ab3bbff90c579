"""Configs of APN (Attractor Patch Networks) and of its dense FFN-only fine-tuning counterpart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import CLConfig

ADAPT_PARAMS = ("all", "ffn")


@dataclass
class ApnConfig(CLConfig):
    """Routed low-rank patch FFN (SPEC section 5, APN); defaults are the paper's."""

    method = "apn"

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
        default=None, metadata={"help": "Indices of the blocks that get patches (negative counts from the end); None = all."}
    )
    adapt_params: str = field(
        default="all",
        metadata={
            "help": "What trains from the second task on: 'all' (everything that trained on the first task) "
            "or 'ffn' (only the patch banks, plus the classification head, which must learn new classes)."
        },
    )
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the patch residual (training only)."})

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
        if self.mode not in self.MODES:
            raise ValueError(f"ApnConfig.mode must be one of {self.MODES}, got {self.mode!r}")
        if self.adapt_params not in ADAPT_PARAMS:
            raise ValueError(f"ApnConfig.adapt_params must be one of {ADAPT_PARAMS}, got {self.adapt_params!r}")
        if self.target_blocks is not None and (
            not isinstance(self.target_blocks, list) or not all(isinstance(b, int) for b in self.target_blocks)
        ):
            raise ValueError(f"ApnConfig.target_blocks must be a list of block indices or None, got {self.target_blocks!r}")
