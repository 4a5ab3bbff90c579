"""``LoraBaselineConfig``: the settings of PEFT's LoRA as a continual baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class LoraBaselineConfig(CLConfig):
    method: ClassVar[str] = "lora"

    r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA scaling numerator (scale = lora_alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch input."})
    target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Module names to adapt; None = the backbone family's attention projections "
                          "(ViT q_proj/v_proj, BERT query/value, GPT-2 c_attn)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("r", "lora_alpha")
        self._check_fraction("lora_dropout")
        if not self.freeze_backbone:
            raise ValueError("LoraBaselineConfig.freeze_backbone must be True: LoRA trains adapters on a frozen "
                             "backbone")
