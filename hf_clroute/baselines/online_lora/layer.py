"""A linear layer with a LoRA that can be merged into it, and the importance of its LoRA matrices.

``y = base(x) + x M^T + s * x A^T B^T``: ``base`` is the frozen backbone layer, ``M`` the sum of
every LoRA merged so far (a buffer saved with the adapter: the backbone's own tensors are never
written, so the adapter alone rebuilds the consolidated weights), ``B A`` the LoRA training now.
``importance_A`` / ``importance_B`` (Omega, the shapes of A and B) weigh the penalty
``sum Omega_A * A^2 + Omega_B * B^2`` on the LoRA training now, as in the authors' release.

Merging restarts the LoRA in place (new A, B = 0), so the optimizer the engine holds keeps
those tensors; its moments for them are dropped before its next step (``reset_optimizer_state``),
so the new LoRA starts as a fresh one would.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook


class MergeableLoRA(nn.Module):
    def __init__(self, base_layer: nn.Linear, r: int, scale: float) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.scale = scale
        out_features, in_features = base_layer.weight.shape
        self.lora_A = nn.Parameter(torch.zeros(r, in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, r))
        self.register_buffer("merged", torch.zeros(out_features, in_features))
        self.register_buffer("importance_A", torch.zeros(r, in_features))
        self.register_buffer("importance_B", torch.zeros(out_features, r))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x) + F.linear(x, self.merged.to(x.dtype))
        return out + F.linear(F.linear(x, self.lora_A.to(x.dtype)), self.lora_B.to(x.dtype)) * self.scale

    @property
    def importance(self) -> torch.Tensor:
        """Every importance weight of this layer, flattened (A's, then B's)."""
        return torch.cat([self.importance_A.flatten(), self.importance_B.flatten()])

    def delta(self) -> torch.Tensor:
        """The current LoRA's change of the weights, s B A."""
        return (self.lora_B @ self.lora_A) * self.scale

    def penalty(self) -> torch.Tensor:
        """sum Omega_A * A^2 + Omega_B * B^2 over the LoRA training now."""
        return (self.importance_A * self.lora_A.pow(2)).sum() + (self.importance_B * self.lora_B.pow(2)).sum()

    @torch.no_grad()
    def restart(self, generator: torch.Generator) -> None:
        """A fresh LoRA (PEFT's init: A Kaiming-uniform, B = 0), its optimizer moments dropped."""
        bound = 1.0 / math.sqrt(self.lora_A.shape[1])  # kaiming_uniform_(a=sqrt(5)) on a fan_in-wide matrix
        fresh = (torch.rand(self.lora_A.shape, generator=generator) * 2 - 1) * bound
        self.lora_A.copy_(fresh.to(self.lora_A.device))
        self.lora_B.zero_()
        reset_optimizer_state([self.lora_A, self.lora_B])

    @torch.no_grad()
    def merge(self) -> None:
        self.merged += self.delta()


#: id -> weak reference of the parameters whose optimizer state goes before the next step (tensors compare
#: elementwise, so they are keyed by id, not held in a set)
_PENDING: dict[int, "weakref.ref[torch.Tensor]"] = {}
_HOOK = None


def reset_optimizer_state(params: list[nn.Parameter]) -> None:
    """Drop the state (moments, step count) of ``params`` in whichever optimizer steps next."""
    global _HOOK
    if _HOOK is None:
        _HOOK = register_optimizer_step_pre_hook(_drop_pending_state)
    _PENDING.update({id(p): weakref.ref(p) for p in params})


def _drop_pending_state(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    if not _PENDING:
        return
    for ref in _PENDING.values():
        param = ref()
        if param is not None:
            optimizer.state.pop(param, None)
    _PENDING.clear()
