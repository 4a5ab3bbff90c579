"""``PromptTuningBaselineConfig``: the settings of PEFT's prompt tuning as a continual baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig

_INITS = ("SAMPLE_VOCAB", "RANDOM")

@dataclass
class PromptTuningBaselineConfig(CLConfig):
    method: ClassVar[str] = "prompt-tuning"

    num_virtual_tokens: int = field(default=10, metadata={"help": "Learned prompt tokens prepended to every input."})
    prompt_tuning_init: str = field(
        default="SAMPLE_VOCAB",
        metadata={"help": "PEFT PromptTuningInit: 'SAMPLE_VOCAB' (copies of random word embeddings) or 'RANDOM'."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_positive("num_virtual_tokens")
        if self.prompt_tuning_init not in _INITS:
            raise ValueError(f"PromptTuningBaselineConfig.prompt_tuning_init must be one of {_INITS}, "
                             f"got {self.prompt_tuning_init!r}")
        if not self.freeze_backbone:
            raise ValueError("PromptTuningBaselineConfig.freeze_backbone must be True: prompt tuning trains only "
                             "the prompt")
