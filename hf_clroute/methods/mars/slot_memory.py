"""The slot memory: a cosine-softmax router over slot keys, one affine adapter per slot.

For a frozen feature h: q = W_q h, p_i = softmax_i(cos(q, k_i) / tau_r) over the
active slots, s = max_i p_i (top-slot confidence), and

    h~ = (sum_i p_i gamma_i) * LN(h) + (sum_i p_i beta_i)

with every (gamma_i, beta_i) initialised to (1, 0), so a fresh memory outputs
LN(h). Storage for ``max_slots`` slots is allocated up front and the inactive
ones are masked out of the softmax: adding a slot then changes no parameter
set (the optimizer, DDP and saved tensors keep their shapes), and a masked
slot gets exactly zero gradient until it is switched on.

What each slot has seen is kept beside the memory, as router-weighted EMA
statistics per slot (``slot_statistics.py``, the paper's anchors), or, in our
variant, as exact per-class statistics (``class_statistics.py``): an EMA over
about the last 1 / (1 - m) steps lets a slot's anchor drift to the current
task's inputs when they are routed to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class SlotCapacityError(RuntimeError):
    """Raised by :meth:`SlotMemory.add_slot` when every preallocated slot is in use."""


@dataclass
class Routing:
    """What one pass through the memory produced (all (B, ...) tensors)."""

    output: torch.Tensor  # h~
    normed: torch.Tensor  # LN(h)
    query: torch.Tensor  # q = W_q h
    probs: torch.Tensor  # p, zero on inactive slots
    confidence: torch.Tensor  # s = max_i p_i
    similarity: torch.Tensor  # max_i cos(q, k_i) over the active slots
    energy: torch.Tensor  # tau * logsumexp_i(cos(q, k_i) / tau): minus the router's free energy


class SlotMemory(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        *,
        num_slots: int = 32,
        max_slots: int = 64,
        query_dim: int | None = None,
        tau: float = 0.07,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not 0 < num_slots <= max_slots:
            raise ValueError(f"SlotMemory needs 0 < num_slots <= max_slots, got {num_slots} and {max_slots}")
        query_dim = query_dim or hidden_size
        generator = torch.Generator().manual_seed(seed)
        self.tau = tau
        self.max_slots = max_slots
        # LN without its own affine: the per-slot (gamma, beta) are the affine.
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False)
        self.query = nn.Linear(hidden_size, query_dim, bias=False)
        with torch.no_grad():
            if query_dim == hidden_size:
                self.query.weight.copy_(torch.eye(hidden_size))  # start by routing on h itself
            else:
                self.query.weight.copy_(torch.randn(query_dim, hidden_size, generator=generator) / hidden_size**0.5)
        self.keys = nn.Parameter(F.normalize(torch.randn(max_slots, query_dim, generator=generator), dim=-1))
        self.gamma = nn.Parameter(torch.ones(max_slots, hidden_size))
        self.beta = nn.Parameter(torch.zeros(max_slots, hidden_size))
        self.register_buffer("num_active", torch.tensor(num_slots, dtype=torch.long))

    @property
    def num_slots(self) -> int:
        return int(self.num_active)

    def active_mask(self) -> torch.Tensor:
        return torch.arange(self.max_slots, device=self.keys.device) < self.num_active

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query, cosine similarities to the keys, routing probabilities) for features ``h``;
        inactive slots have similarity -inf and probability 0."""
        query = self.query(h)
        cosine = F.normalize(query, dim=-1) @ F.normalize(self.keys, dim=-1).T
        cosine = cosine.masked_fill(~self.active_mask(), float("-inf"))
        return query, cosine, (cosine / self.tau).softmax(dim=-1)

    def forward(self, h: torch.Tensor) -> Routing:
        query, cosine, probs = self.route(h)
        normed = self.norm(h)
        output = (probs @ self.gamma) * normed + probs @ self.beta
        energy = self.tau * torch.logsumexp(cosine / self.tau, dim=-1)
        return Routing(output, normed, query, probs, probs.max(dim=-1).values, cosine.max(dim=-1).values, energy)

    @torch.no_grad()
    def set_key(self, index: int, key: torch.Tensor) -> None:
        self.keys[index] = F.normalize(key.to(self.keys), dim=-1)

    @torch.no_grad()
    def add_slot(self, key: torch.Tensor) -> int:
        """Switch on the next slot with ``key`` and an identity adapter; returns its index."""
        index = self.num_slots
        if index >= self.max_slots:
            raise SlotCapacityError(f"all {self.max_slots} slots are in use")
        self.set_key(index, key)
        self.gamma[index] = 1.0
        self.beta[index] = 0.0
        self.num_active += 1
        return index
