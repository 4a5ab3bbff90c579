"""Class prototypes banked at task starts: the anchors of the memory-free control ``mars-prototypes``.

Every training feature the head reads (LN(h) of the frozen encoder, which nothing trains) is
folded into exact running sums per class, never decayed. At each later task's start the bank is
replaced by the means of every class seen so far, one prototype per class; the current task's
classes join it at the next start. Stage 2 distils the head as it was at that start on the bank,
as MaRS distils it on the slot means banked at task starts (``anchor_memory='task_start'``): what
is left of those anchors once no router spreads a task's inputs over slots.

Sums are float64 (thousands of features per class). Two buffers: ``running`` = [count, sum] per
class and ``entries`` = [class, mean] per banked prototype; they are resized from
``extra_state`` before a checkpoint's tensors load.
"""

from __future__ import annotations

import torch
from torch import nn


class ClassPrototypes(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.register_buffer("running", torch.zeros(0, 1 + dim, dtype=torch.float64))
        self.register_buffer("entries", torch.zeros(0, 1 + dim))

    def __len__(self) -> int:
        """Banked prototypes."""
        return len(self.entries)

    @property
    def num_classes(self) -> int:
        """Classes with a row of running sums (seen or not)."""
        return len(self.running)

    @property
    def labels(self) -> torch.Tensor:
        """The class of each banked prototype."""
        return self.entries[:, 0].long()

    def resize(self, num_classes: int, banked: int) -> None:
        """Make room for saved buffers: ``num_classes`` rows of sums, ``banked`` prototypes."""
        self.running = self.running.new_zeros(num_classes, 1 + self.dim)
        self.entries = self.entries.new_zeros(banked, 1 + self.dim)

    @torch.no_grad()
    def update(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Fold a batch of (B, d) features with their labels into the running sums."""
        if len(labels) == 0:
            return
        extra = int(labels.max()) + 1 - self.num_classes
        if extra > 0:
            self.running = torch.cat([self.running, self.running.new_zeros(extra, 1 + self.dim)])
        rows = torch.cat([torch.ones(len(labels), 1, dtype=torch.float64, device=features.device),
                          features.to(torch.float64)], dim=1)
        self.running.index_add_(0, labels.to(self.running.device), rows.to(self.running.device))

    @torch.no_grad()
    def bank(self) -> int:
        """Replace the bank by the mean of every class seen so far; returns how many were banked."""
        counts = self.running[:, 0]
        seen = torch.nonzero(counts > 0).flatten()
        means = self.running[seen, 1:] / counts[seen].unsqueeze(1)
        self.entries = torch.cat([seen.unsqueeze(1).to(means), means], dim=1).to(self.entries)
        return len(seen)

    def anchors(self) -> torch.Tensor:
        """The banked prototypes (P, d), in the head's input space."""
        return self.entries[:, 1:]
