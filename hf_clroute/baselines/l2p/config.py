"""``L2PConfig``: Learning to Prompt (Wang et al., CVPR 2022), the paper's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.baselines.prompt_pool.base import PromptPoolConfig


@dataclass
class L2PConfig(PromptPoolConfig):
    method: ClassVar[str] = "l2p"

    pool_size: int = field(
        default=10, metadata={"help": "M: prompts in the pool, each with a learned key (the paper's 10)."}
    )
    prompt_length: int = field(default=5, metadata={"help": "Tokens per prompt (the paper's 5)."})
    top_n: int = field(
        default=5,
        metadata={"help": "N: prompts chosen per input, the N keys of highest cosine to the frozen query (the paper's "
                          "5); their N * prompt_length tokens are inserted after the first token."},
    )
    readout: str = field(
        default="prompts",
        metadata={"help": "What the head reads: 'prompts' (the paper's: the mean of the inserted prompt positions' "
                          "outputs) or 'pooled' (the backbone's own pooling over its own tokens, as every other "
                          "method here reads)."},
    )
    current_task_loss: bool = field(
        default=True,
        metadata={"help": "On (the paper's code trains with its classes mask): cross-entropy over the current task's "
                          "classes only. The head grows with the stream, so every logit is a class already seen: "
                          "the paper's mask of unseen classes holds by construction. Prediction uses every seen "
                          "class."},
    )

    READOUTS: ClassVar[tuple[str, ...]] = ("prompts", "pooled")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_length("pool_size", "prompt_length", "top_n")
        if self.top_n > self.pool_size:
            raise ValueError(f"L2PConfig.top_n ({self.top_n}) must be at most pool_size ({self.pool_size})")
        if self.readout not in self.READOUTS:
            raise ValueError(f"L2PConfig.readout must be one of {self.READOUTS}, got {self.readout!r}")
