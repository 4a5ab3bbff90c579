"""``OnlineLoraConfig``: Online-LoRA (Wei et al., WACV 2025), task-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class OnlineLoraConfig(CLConfig):
    method: ClassVar[str] = "online-lora"

    r: int = field(default=4, metadata={"help": "LoRA rank of each adapted projection (ours: 4)."})
    lora_alpha: float = field(default=4.0, metadata={"help": "LoRA scale numerator: scale = lora_alpha / r (ours: 1)."})
    target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Module names to adapt; None = the backbone family's attention query and value "
                          "projections (ViT q_proj/v_proj, BERT query/value), as for the lora baseline."},
    )
    window: int = field(
        default=5,
        metadata={"help": "Loss window: the last `window` steps' training losses (the batch's cross-entropy plus "
                          "the hard buffer's, summed) whose mean and variance detect a plateau (authors' release: "
                          "5). The test runs from the first step on, on the losses so far."},
    )
    plateau_mean: float = field(
        default=6.0,
        metadata={"help": "A plateau: the window's mean summed loss below this and its variance below "
                          "plateau_variance, after a peak (a window mean above the last plateau's mean + std) "
                          "or before the first plateau (authors' release: 6.0)."},
    )
    plateau_variance: float = field(
        default=0.1, metadata={"help": "A plateau's variance bound on the summed loss (authors' release: 0.1)."}
    )
    hard_buffer_size: int = field(
        default=4,
        metadata={"help": "Hard buffer: the samples of highest loss among the buffer and the current batch, by the "
                          "losses of this step's forward (authors' release: 4). Replayed with every batch: each "
                          "sample's cross-entropy is added to the training loss. At a plateau the importance of "
                          "the LoRA matrices is estimated on them."},
    )
    penalty_weight: float = field(
        default=2000.0,
        metadata={"help": "lambda of the penalty lambda / 2 * sum(Omega_A * A^2 + Omega_B * B^2) on the current "
                          "LoRA's matrices; Omega: the squared gradient of the cross-entropy against the predicted "
                          "label, summed over the hard buffer at a plateau, averaged over plateaus (a running "
                          "mean) (authors' release: 2000)."},
    )
    current_task_loss: bool = field(
        default=False,
        metadata={"help": "Off: Online-LoRA is task-free, so there is no current task to restrict the loss to; "
                          "cross-entropy over every class seen so far. The head grows with the stream, so unseen "
                          "classes have no logit (the paper's mask of unseen classes)."},
    )
    init_seed: int = field(
        default=0, metadata={"help": "Seed of every new LoRA's A matrix, independent of the global RNG."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError("OnlineLoraConfig.freeze_backbone must be True: Online-LoRA trains LoRA on a frozen "
                             "backbone")
        for name in ("r", "window", "hard_buffer_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"OnlineLoraConfig.{name} must be a positive integer, got {value!r}")
        self._check_positive("lora_alpha", "plateau_mean", "plateau_variance")
        if not isinstance(self.penalty_weight, (int, float)) or self.penalty_weight < 0:
            raise ValueError(f"OnlineLoraConfig.penalty_weight must be a number >= 0, got {self.penalty_weight!r}")
