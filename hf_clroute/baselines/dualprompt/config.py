"""``DualPromptConfig``: DualPrompt (Wang et al., ECCV 2022), the paper's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.baselines.prompt_pool.base import PromptPoolConfig


@dataclass
class DualPromptConfig(PromptPoolConfig):
    method: ClassVar[str] = "dualprompt"

    g_length: int = field(
        default=5,
        metadata={"help": "G-prompt length (the paper's 5): that many prefix keys and as many prefix values per G "
                          "block (the shape of the paper's code; its text halves the length, which 5 does not allow)."},
    )
    g_layers: list[int] | None = field(
        default=None,
        metadata={"help": "0-based blocks of the shared G-prompt; None = the paper's blocks 1-2 (indices 0, 1) "
                          "that the backbone has."},
    )
    e_length: int = field(
        default=20, metadata={"help": "E-prompt length (the paper's 20), prefix keys and values as for G."}
    )
    e_layers: list[int] | None = field(
        default=None,
        metadata={"help": "0-based blocks of the E-prompts; None = the paper's blocks 3-5 (indices 2, 3, 4) that the "
                          "backbone has."},
    )
    e_pool_size: int = field(
        default=10,
        metadata={"help": "E-prompts (one per task, each with a key; the paper's 10 = its number of tasks). Training "
                          "task t uses E-prompt t (the task identity is known while training) and pulls its key toward "
                          "the query; prediction picks the E-prompt of the best-matching key among the tasks started. "
                          "A stream with more tasks is refused before anything trains."},
    )
    current_task_loss: bool = field(
        default=True,
        metadata={"help": "On (the paper's code masks the classes of other tasks while training): cross-entropy over "
                          "the current task's classes only. The head grows with the stream, so unseen classes have no "
                          "logit at all. Prediction uses every seen class."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_length("g_length", "e_length", "e_pool_size")
        self._check_layers("g_layers", "e_layers")
        if self.g_layers and self.e_layers and set(self.g_layers) & set(self.e_layers):
            raise ValueError(f"DualPromptConfig.g_layers {self.g_layers} and e_layers {self.e_layers} share blocks")
