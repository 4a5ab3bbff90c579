"""``CodaPromptConfig``: CODA-Prompt (Smith et al., CVPR 2023), the paper's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.baselines.prompt_pool.base import PromptPoolConfig


@dataclass
class CodaPromptConfig(PromptPoolConfig):
    method: ClassVar[str] = "coda-prompt"

    components_per_task: int = field(
        default=10,
        metadata={"help": "Prompt components added at each task's start (the paper's pool of 100 over its 10 tasks). "
                          "The components of earlier tasks are frozen then; the new ones start orthogonal to them "
                          "(Gram-Schmidt), per block, separately for prompts, keys and attention vectors. A stream "
                          "whose tasks x components exceed the hidden size is refused before anything trains."},
    )
    prompt_length: int = field(
        default=8,
        metadata={"help": "Length of each component (the paper's 8): the first half are prefix keys, the second half "
                          "prefix values (4 + 4 by default, as the paper's code splits it)."},
    )
    layers: list[int] | None = field(
        default=None,
        metadata={"help": "0-based blocks that get a prompt; None = the paper's blocks 1-5 (indices 0-4) that the "
                          "backbone has."},
    )
    pull_weight: float = field(
        default=0.0,
        metadata={"help": "Must stay 0: CODA-Prompt has no surrogate key loss; its keys and attention vectors learn "
                          "end to end through the classification loss."},
    )
    current_task_loss: bool = field(
        default=True,
        metadata={"help": "On (the paper's code sets the logits of earlier tasks' classes to -inf while training): "
                          "cross-entropy over the current task's classes only. The head grows with the stream, so "
                          "unseen classes have no logit. Prediction uses every seen class."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_length("components_per_task", "prompt_length")
        self._check_layers("layers")
        if self.prompt_length % 2:
            raise ValueError("CodaPromptConfig.prompt_length must be even (half keys, half values), "
                             f"got {self.prompt_length}")
        if self.pull_weight != 0:
            raise ValueError("CodaPromptConfig.pull_weight must be 0 (CODA-Prompt has no surrogate loss), "
                             f"got {self.pull_weight!r}")
