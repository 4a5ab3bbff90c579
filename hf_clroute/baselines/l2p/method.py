"""L2P: a pool of prompts, the top-N by key match prepended at the input.

The frozen backbone's pooled feature (ViT: [CLS]) is the query; the N keys with the highest
cosine to it pick N prompts, whose tokens go in after the first token (as VPT's do). The
keys learn only through the surrogate loss that pulls each chosen key toward its query.
Not built: the paper's optional frequency penalty on prompt use and batch-wise selection
(one prompt set per batch); every input picks its own prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hf_clroute.baselines.l2p.config import L2PConfig
from hf_clroute.baselines.prompt_pool.base import (
    PromptPoolMethod,
    Prompts,
    cosine_top,
    pull_loss,
    uniform,
)

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


class L2P(PromptPoolMethod):
    config_class = L2PConfig

    def attach(self, model: "CLModel") -> None:
        cfg = self.config
        hidden = model.spec.hidden_size(model.backbone)
        generator = torch.Generator().manual_seed(cfg.init_seed)
        self.prompt_pool = nn.Parameter(uniform(generator, cfg.pool_size, cfg.prompt_length, hidden))
        self.keys = nn.Parameter(uniform(generator, cfg.pool_size, hidden))
        self.injector.install_input(model.backbone)

    def select(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, cosines) of the top-N keys for each query, best first."""
        return cosine_top(query, self.keys, self.config.top_n)

    def prompts(self, model: "CLModel", query: torch.Tensor) -> Prompts:
        indices, cosines = self.select(query)
        chosen = self.prompt_pool[indices].flatten(1, 2)  # (B, N * length, d)
        return chosen, {}, pull_loss(cosines, self.config.pull_weight)

    def readout(self, model: "CLModel", hidden: torch.Tensor, inserted: int, mask: torch.Tensor | None) -> torch.Tensor:
        if self.config.readout == "prompts":
            return hidden[:, 1:1 + inserted].mean(dim=1)
        return super().readout(model, hidden, inserted, mask)
