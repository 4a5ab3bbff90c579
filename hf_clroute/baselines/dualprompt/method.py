"""DualPrompt: a shared G-prompt in the first blocks, task E-prompts chosen by key, as prefixes.

Both are prefix-tuning on the attention's keys and values (``prompt_pool.insertion``):
the G-prompt at ``g_layers`` for every input; at ``e_layers`` the E-prompt of the current
task while training (its key pulled toward the frozen query by the surrogate loss), and at
prediction the E-prompt whose key has the highest cosine to the query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.baselines.dualprompt.config import DualPromptConfig
from hf_clroute.baselines.prompt_pool.base import (
    PromptPoolMethod,
    Prompts,
    cosine_top,
    pull_loss,
    uniform,
)
from hf_clroute.core.method import StepContext
from hf_clroute.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

PAPER_G_LAYERS, PAPER_E_LAYERS = [0, 1], [2, 3, 4]


class DualPrompt(PromptPoolMethod):
    config_class = DualPromptConfig

    def __init__(self, config: DualPromptConfig) -> None:
        super().__init__(config)
        self.tasks_started = 0  # E-prompts (and keys) that prediction may choose among

    def attach(self, model: "CLModel") -> None:
        cfg = self.config
        hidden, blocks = model.spec.hidden_size(model.backbone), len(get_blocks(model.backbone))
        self.g_layers = cfg.resolve_layers("g_layers", PAPER_G_LAYERS, blocks)
        self.e_layers = cfg.resolve_layers("e_layers", PAPER_E_LAYERS, blocks)
        if set(self.g_layers) & set(self.e_layers):
            raise ValueError(f"DualPromptConfig: G blocks {self.g_layers} and E blocks {self.e_layers} overlap")
        generator = torch.Generator().manual_seed(cfg.init_seed)
        # (blocks, key/value, length, d): prefix keys [.., 0] and values [.., 1] of every block
        self.g_prompt = nn.Parameter(uniform(generator, len(self.g_layers), 2, cfg.g_length, hidden))
        self.e_prompts = nn.Parameter(uniform(generator, cfg.e_pool_size, len(self.e_layers), 2, cfg.e_length, hidden))
        self.e_keys = nn.Parameter(uniform(generator, cfg.e_pool_size, hidden))
        self.injector.install_prefix(model.backbone, model.spec, self.g_layers + self.e_layers)

    def check_stream(self, n_tasks: int) -> None:
        total = self.tasks_done + n_tasks  # an adapter loaded to continue training has used some already
        if total > self.config.e_pool_size:
            raise UserInputError(f"DualPromptConfig.e_pool_size is {self.config.e_pool_size}: one E-prompt per task, "
                                 f"and this stream brings the task count to {total}; raise e_pool_size to at least "
                                 f"{total}")

    def on_task_start(self, model: "CLModel", experience: Any, ctx: StepContext) -> None:
        self.tasks_started = self.tasks_done + 1

    def choose(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(E-prompt index (B,), cosine of its key to the query (B,)): the current task's while training,
        else the best-matching key among the tasks started."""
        if self.training:
            index = torch.full((query.shape[0],), self.tasks_done, dtype=torch.long, device=query.device)
            cosines = torch.nn.functional.cosine_similarity(query, self.e_keys[index].float(), dim=-1)
            return index, cosines
        index, cosines = cosine_top(query, self.e_keys[: self.tasks_started], 1)
        return index[:, 0], cosines[:, 0]

    def prompts(self, model: "CLModel", query: torch.Tensor) -> Prompts:
        batch = query.shape[0]
        prefixes = {layer: tuple(self.g_prompt[i, kv].expand(batch, -1, -1) for kv in (0, 1))
                    for i, layer in enumerate(self.g_layers)}
        aux: dict[str, torch.Tensor] = {}
        if self.tasks_started or self.training:
            index, cosines = self.choose(query)
            chosen = self.e_prompts[index]  # (B, blocks, 2, length, d)
            prefixes |= {layer: (chosen[:, i, 0], chosen[:, i, 1]) for i, layer in enumerate(self.e_layers)}
            if self.training:
                aux = pull_loss(cosines[:, None], self.config.pull_weight)
        return None, prefixes, aux

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "tasks_started": self.tasks_started}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self.tasks_started = int(state.get("tasks_started", self.tasks_done))
