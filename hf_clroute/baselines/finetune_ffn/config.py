"""``FfnFinetuneConfig``: the settings of FFN-only fine-tuning after the first task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hf_clroute.baselines.finetune.config import FinetuneConfig


@dataclass
class FfnFinetuneConfig(FinetuneConfig):
    """Dense counterpart of APN's ``adapt_params='ffn'``: train everything on the first task,
    then only the blocks' FFNs (and the head). The char-LM suite's "dense, FFN-only" variant."""

    method: ClassVar[str] = "finetune-ffn"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.freeze_backbone:
            raise ValueError("FfnFinetuneConfig.freeze_backbone must be False: the FFNs are backbone weights")
