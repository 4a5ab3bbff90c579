"""A reservoir-sampling replay buffer that saves with the adapter.

Reservoir sampling keeps a uniform sample of everything seen so far in a fixed
memory, without knowing the stream length (Vitter 1985) — the standard memory
for experience replay and for QOA's support sets. The buffer is an
``nn.Module`` whose storage tensors are buffers, so ``CLModel.save_pretrained``
writes its contents to safetensors; ``extra_state`` holds the sizes needed to
re-allocate it before loading.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ReservoirBuffer(nn.Module):
    """Fixed-capacity uniform sample of a stream of ``{name: tensor}`` batches."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        super().__init__()
        if capacity <= 0:
            raise ValueError(f"ReservoirBuffer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.seed = seed
        self.num_seen = 0
        self._fields: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}

    def __len__(self) -> int:
        return min(self.num_seen, self.capacity)

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self._fields[name] = (shape, dtype)
        self.register_buffer(f"data_{name}", torch.zeros(self.capacity, *shape, dtype=dtype))

    def storage(self, name: str) -> torch.Tensor:
        return getattr(self, f"data_{name}")

    def _slot(self, index: int) -> int | None:
        """Where the ``index``-th stream item goes (None: not kept).

        The decision is a pure function of (seed, index), so it is the same on every
        process and after a save/load, with no RNG state to carry.
        """
        if index < self.capacity:
            return index
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        j = int(torch.randint(0, index + 1, (1,), generator=g))
        return j if j < self.capacity else None

    @torch.no_grad()
    def add(self, batch: dict[str, torch.Tensor]) -> None:
        sizes = {v.shape[0] for v in batch.values()}
        if len(sizes) != 1:
            raise ValueError(f"ReservoirBuffer.add: fields have different batch sizes {sorted(sizes)}")
        for name, value in batch.items():
            if name not in self._fields:
                self._allocate(name, tuple(value.shape[1:]), value.dtype)
            elif tuple(value.shape[1:]) != self._fields[name][0]:
                raise ValueError(
                    f"ReservoirBuffer field {name!r}: shape {tuple(value.shape[1:])} != {self._fields[name][0]}")
        for i in range(sizes.pop()):
            slot = self._slot(self.num_seen)
            self.num_seen += 1
            if slot is not None:
                for name, value in batch.items():
                    self.storage(name)[slot] = value[i].to(self.storage(name).device)

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """``n`` items drawn uniformly without replacement (all of them when fewer are held)."""
        size = len(self)
        if size == 0:
            raise ValueError("ReservoirBuffer.sample: the buffer is empty")
        index = torch.randperm(size, generator=generator)[: min(n, size)]
        return {name: self.storage(name)[index.to(self.storage(name).device)] for name in self._fields}

    def contents(self) -> dict[str, torch.Tensor]:
        return {name: self.storage(name)[: len(self)] for name in self._fields}

    # ---- state for the adapter checkpoint --------------------------------------
    def extra_state(self) -> dict[str, Any]:
        fields = {n: [list(shape), str(dtype).removeprefix("torch.")] for n, (shape, dtype) in self._fields.items()}
        return {"num_seen": self.num_seen, "fields": fields}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.num_seen = int(state.get("num_seen", 0))
        for name, (shape, dtype) in state.get("fields", {}).items():
            if name not in self._fields:
                self._allocate(name, tuple(shape), getattr(torch, dtype))
