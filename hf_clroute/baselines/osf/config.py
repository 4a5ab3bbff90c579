"""``OsfConfig``: the settings of PEFT's OSF (orthogonal subspace fine-tuning) as a continual baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class OsfConfig(CLConfig):
    method: ClassVar[str] = "osf"

    effective_rank: float = field(
        default=0.3,
        metadata={"help": "Preserved fraction during the first task: the top singular directions of each target "
                          "weight that stay frozen, as a fraction of its smaller dimension (PEFT's "
                          "OSFConfig.effective_rank as a fraction; the rest of the spectrum trains). 0.3 is the "
                          "first task of PEFT's continual-learning example."},
    )
    rank_growth: float = field(
        default=0.1,
        metadata={"help": "Added to the preserved fraction at every task boundary, after the finished task's "
                          "update is consolidated into the weight and the weight decomposed again (PEFT's example "
                          "grows 0.3 -> 0.5 -> 0.7 over its three tasks). 0: the same preserved rank every task."},
    )
    max_effective_rank: float = field(
        default=0.9,
        metadata={"help": "The preserved fraction never grows past this, so every target keeps a trainable part "
                          "on long streams. Below 1."},
    )
    target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Module names to adapt (nn.Linear only; a name matches a module path ending in it); "
                          "None = every block's attention query/key/value and output projections and its two MLP "
                          "layers (ViT q_proj/k_proj/v_proj/o_proj/fc1/fc2, BERT query/key/value/"
                          "attention.output.dense/intermediate.dense/output.dense), the attention and MLP "
                          "projections PEFT's example adapts."},
    )
    reproject: bool = field(
        default=True,
        metadata={"help": "After every optimiser step, project the trained singular vectors back onto the "
                          "complement of the preserved directions. PEFT projects each gradient; AdamW's "
                          "per-coordinate step sizes then let a step leak into the preserved directions. False: "
                          "PEFT's gradient projection alone."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        for key in ("effective_rank", "max_effective_rank"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < value < 1.0:
                raise ValueError(f"{name}.{key} must be a fraction in (0, 1) of each target weight's smaller "
                                 f"dimension, got {value!r}")
        if not isinstance(self.rank_growth, (int, float)) or isinstance(self.rank_growth, bool) \
                or not 0.0 <= self.rank_growth < 1.0:
            raise ValueError(f"{name}.rank_growth must be a number in [0, 1), got {self.rank_growth!r}")
        if self.max_effective_rank < self.effective_rank:
            raise ValueError(f"{name}.max_effective_rank ({self.max_effective_rank}) must be at least "
                             f"effective_rank ({self.effective_rank})")
        if self.target_modules is not None and (
                not isinstance(self.target_modules, list) or not self.target_modules
                or not all(isinstance(t, str) and t for t in self.target_modules)):
            raise ValueError(f"{name}.target_modules must be None or a non-empty list of module names, "
                             f"got {self.target_modules!r}")
        if not isinstance(self.reproject, bool):
            raise ValueError(f"{name}.reproject must be true or false, got {self.reproject!r}")
        if not self.freeze_backbone:
            raise ValueError(f"{name}.freeze_backbone must be True: OSF trains PEFT's singular-vector adapters; the "
                             "backbone's own tensors stay as loaded")

    def fraction_at(self, task: int) -> float:
        """The preserved fraction while training task ``task`` (0-based), rounded so that PEFT resolves the
        same rank from the saved value."""
        return round(min(self.effective_rank + task * self.rank_growth, self.max_effective_rank), 6)
