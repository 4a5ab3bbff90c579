"""Router-weighted EMA statistics per slot, and the slot anchors built from them.

For every training batch of memory inputs LN(h_b) with routing probabilities p_bi,

    c_i  <- m c_i  + (1 - m) mean_b p_bi            (how much of the stream slot i takes)
    mu_i <- m mu_i + (1 - m) mean_b p_bi LN(h_b)    (the LN(h) mass slot i takes)

and slot i's anchor is its adapter applied to its router-weighted mean input,

    a_i = gamma_i * (mu_i / max(c_i, varsigma)) + beta_i,

a point in the head's input space that stands for what the slot has seen. Both sums
start at zero and decay alike, so mu_i / c_i is a weighted mean of past inputs with no
start-up bias; the floor varsigma only matters for slots that were barely used. A slot
that never received routing mass (c_i = 0: inactive so far, masked out of the softmax)
has no statistics and gives no anchor.

The statistics are folded in from the *global* batch (the method gathers it), so every
process holds the same numbers one process would have, with no separate reduce.
"""

from __future__ import annotations

import torch
from torch import nn


class SlotStatistics(nn.Module):
    def __init__(self, num_slots: int, dim: int, momentum: float) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("mass", torch.zeros(num_slots))  # c_i
        self.register_buffer("sums", torch.zeros(num_slots, dim))  # mu_i

    @torch.no_grad()
    def update(self, normed: torch.Tensor, probs: torch.Tensor) -> None:
        """One EMA step from a batch: ``normed`` (B, d) = LN(h), ``probs`` (B, S) routing probabilities."""
        if len(probs) == 0:
            return
        probs, normed = probs.to(self.mass), normed.to(self.sums)
        m = self.momentum
        self.mass.mul_(m).add_(probs.mean(0), alpha=1 - m)
        self.sums.mul_(m).add_(probs.T @ normed / len(probs), alpha=1 - m)

    def anchor_slots(self, active: torch.Tensor) -> torch.Tensor:
        """Indices of the active slots with statistics (c_i > 0)."""
        return torch.nonzero(active.to(self.mass.device) & (self.mass > 0)).flatten()

    def means(self, varsigma: float) -> torch.Tensor:
        """mu_i / max(c_i, varsigma) for every slot (S, d)."""
        return self.sums / self.mass.clamp_min(varsigma).unsqueeze(1)

    def anchors(
        self, gamma: torch.Tensor, beta: torch.Tensor, active: torch.Tensor, varsigma: float
    ) -> torch.Tensor:
        """a_i = gamma_i * (mu_i / max(c_i, varsigma)) + beta_i for every active slot with statistics,
        with the adapters as they are now: (A, d)."""
        slots = self.anchor_slots(active)
        return gamma[slots] * self.means(varsigma)[slots].to(gamma) + beta[slots]

    @torch.no_grad()
    def reset(self) -> None:
        """Start the statistics afresh (the next segment of the stream)."""
        self.mass.zero_()
        self.sums.zero_()


class AnchorBank(nn.Module):
    """Slot anchors kept after the statistics that made them have moved on.

    The live statistics are an EMA over about ``stat_horizon`` steps, so a slot's anchor
    follows whatever the slot is routed now: once a task ends its inputs are no longer
    represented. The bank stores, at each snapshot, every used slot's router-weighted mean
    input mu_i / c_i (in LN(h) space) with the slot's index; an anchor is rebuilt with the
    slot's adapter as it is when used, a = gamma_i * m + beta_i, the paper's formula applied
    to a mean that no longer drifts. Its size is bounded by slots x snapshots.

    One buffer, ``entries`` = [slot index, mean] per row: checkpointing treats empty tensors
    as aliases of each other and drops all but one, so the bank keeps no second empty buffer.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("entries", torch.zeros(0, 1 + dim))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def slots(self) -> torch.Tensor:
        return self.entries[:, 0].long()

    @property
    def means(self) -> torch.Tensor:
        return self.entries[:, 1:]

    def resize(self, size: int) -> None:
        """Make room for ``size`` entries so saved buffers load into them."""
        self.entries = self.entries.new_zeros(size, self.entries.shape[1])

    @torch.no_grad()
    def snapshot(self, stats: SlotStatistics, active: torch.Tensor, varsigma: float) -> int:
        """Bank the means of the active slots that took at least ``varsigma`` of the routing
        mass since the statistics started, then restart them; returns how many were banked."""
        slots = torch.nonzero(active.to(stats.mass.device) & (stats.mass >= varsigma)).flatten()
        rows = torch.cat([slots.unsqueeze(1).to(stats.sums), stats.means(varsigma)[slots]], dim=1)
        self.entries = torch.cat([self.entries, rows.to(self.entries)])
        stats.reset()
        return len(slots)

    def anchors(self, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """a = gamma_slot * m + beta_slot for every banked mean: (len, d)."""
        slots = self.slots.to(gamma.device)
        return gamma[slots] * self.means.to(gamma) + beta[slots]
