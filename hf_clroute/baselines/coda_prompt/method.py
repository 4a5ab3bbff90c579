"""CODA-Prompt: each block's prompt is a weighted sum of components, weighted by the query.

For the frozen query q, component m of a block has a prompt P_m (length x d), a key K_m and
an attention vector A_m (d each); its weight is alpha_m = cos(q * A_m, K_m) (q attended
elementwise by A_m), and the block's prefix is sum_m alpha_m P_m, split into keys and values.
Components come in one chunk per task: at a task's start the earlier chunks freeze (no
gradient from then on) and a new chunk starts orthogonal to all of them, so new prompts,
keys and attention vectors begin in directions the old ones do not use. Everything learns
through the classification loss alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.baselines.coda_prompt.config import CodaPromptConfig
from hf_clroute.baselines.prompt_pool.base import PromptPoolMethod, Prompts
from hf_clroute.core.method import StepContext
from hf_clroute.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

PAPER_LAYERS = [0, 1, 2, 3, 4]


class Components(nn.Module):
    """One task's components for every prompted block: prompts (blocks, c, length, d), keys and
    attention vectors (blocks, c, d)."""

    def __init__(self, blocks: int, count: int, length: int, hidden: int) -> None:
        super().__init__()
        self.prompts = nn.Parameter(torch.zeros(blocks, count, length, hidden))
        self.keys = nn.Parameter(torch.zeros(blocks, count, hidden))
        self.attention = nn.Parameter(torch.zeros(blocks, count, hidden))


def orthogonal_to(old: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` unit vectors orthogonal to each other and to every row of ``old`` (n, D): random
    Gaussian vectors, projected off an orthonormal basis of the old rows' span, then orthonormalised."""
    dim = old.shape[1]
    if old.shape[0] + count > dim:
        raise ValueError(f"CodaPromptConfig.components_per_task: {old.shape[0]} components so far + {count} new do not "
                         f"fit orthogonally in {dim} dimensions; use fewer components per task")
    new = torch.randn(dim, count, generator=generator, dtype=torch.float64)
    if old.shape[0]:
        basis, _ = torch.linalg.qr(old.T.double())  # (D, n), orthonormal columns spanning the old rows
        new = new - basis @ (basis.T @ new)
    new, _ = torch.linalg.qr(new)
    return new.T.float()


class CodaPrompt(PromptPoolMethod):
    config_class = CodaPromptConfig

    def attach(self, model: "CLModel") -> None:
        cfg = self.config
        self.hidden = model.spec.hidden_size(model.backbone)
        self.layers = cfg.resolve_layers("layers", PAPER_LAYERS, len(get_blocks(model.backbone)))
        self.chunks = nn.ModuleList()  # one Components per task started
        self.register_buffer("device_anchor", torch.zeros(0), persistent=False)  # where new chunks go
        self.injector.install_prefix(model.backbone, model.spec, self.layers)

    def check_stream(self, n_tasks: int) -> None:
        tasks, per_task = self.tasks_done + n_tasks, self.config.components_per_task
        if tasks * per_task > self.hidden:  # keys and attention vectors live in the hidden size
            raise UserInputError(f"CodaPromptConfig.components_per_task is {per_task}: {tasks} tasks x {per_task} "
                                 f"components do not fit orthogonally in the backbone's {self.hidden} dimensions; "
                                 f"use at most {self.hidden // tasks} per task")

    def _new_chunk(self) -> Components:
        cfg = self.config
        return Components(len(self.layers), cfg.components_per_task, cfg.prompt_length, self.hidden)

    @torch.no_grad()
    def add_task_components(self) -> None:
        """Append a chunk initialised orthogonal to every earlier chunk, per block and per kind."""
        cfg, chunk = self.config, self._new_chunk()
        generator = torch.Generator().manual_seed(cfg.init_seed * 1_000_003 + len(self.chunks))
        for name in ("prompts", "keys", "attention"):
            new = getattr(chunk, name)
            for block in range(len(self.layers)):
                old = [getattr(c, name)[block].flatten(1) for c in self.chunks]
                old = torch.cat(old) if old else new.new_zeros(0, new[block].flatten(1).shape[1])
                new[block] = orthogonal_to(old.cpu(), cfg.components_per_task, generator).view_as(new[block])
        self.chunks.append(chunk.to(self.device_anchor.device))

    def on_task_start(self, model: "CLModel", experience: Any, ctx: StepContext) -> None:
        while len(self.chunks) <= self.tasks_done:  # a resumed task already has its chunk
            self.add_task_components()
        self._train_only(self.tasks_done)

    def _train_only(self, task: int) -> None:
        for index, chunk in enumerate(self.chunks):
            chunk.requires_grad_(index == task)

    def weights(self, query: torch.Tensor, block: int) -> torch.Tensor:
        """alpha (B, C): cos(q * A_m, K_m) for every component m so far, at prompted block ``block``."""
        keys = torch.cat([c.keys[block] for c in self.chunks])
        attention = torch.cat([c.attention[block] for c in self.chunks])
        attended = F.normalize(query[:, None, :] * attention[None].float(), dim=-1)  # (B, C, d)
        return torch.einsum("bcd,cd->bc", attended, F.normalize(keys.float(), dim=-1))

    def prompts(self, model: "CLModel", query: torch.Tensor) -> Prompts:
        if not len(self.chunks):
            return None, {}, {}
        half = self.config.prompt_length // 2
        prefixes = {}
        for block, layer in enumerate(self.layers):
            components = torch.cat([c.prompts[block] for c in self.chunks])  # (C, length, d)
            prompt = torch.einsum("bc,cld->bld", self.weights(query, block).to(components.dtype), components)
            prefixes[layer] = (prompt[:, :half], prompt[:, half:])
        return None, prefixes, {}

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "chunks": len(self.chunks)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        while len(self.chunks) < int(state.get("chunks", 0)):
            self.chunks.append(self._new_chunk().to(self.device_anchor.device))
        self._train_only(self.tasks_done)
