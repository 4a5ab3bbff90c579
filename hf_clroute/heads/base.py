"""Closed-form heads fitted from class statistics of frozen features.

A statistics head never trains by gradient: it sums per-class statistics of the
features (counts, sums, second moments) in one online pass and solves for its
classifier in closed form. Sums commute, so the result does not depend on the
order of the stream, on the batch size, or on how the stream is split over
processes; only floating-point rounding does. Every statistic and every cached
solution is float64 for that reason: sums over many batches must agree between
1 and N processes (and with a batch fit on all data) far below the gaps that
change a prediction.

The life cycle is ``accumulate`` (local, *pending* sums; predictions do not
change), then ``sync`` (all processes together: pending sums are reduced over
processes, folded into the stored statistics, and the solution is recomputed).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import nn

Reduce = Callable[[torch.Tensor], torch.Tensor | None]
FLOAT = torch.float64


class StatisticsHead(nn.Module):
    """Base class: statistics buffers, pending sums, growth, sync and masking.

    A subclass names its statistics and its solution with their shapes for
    ``k`` classes (:meth:`_statistic_shapes`, :meth:`_solution_shapes`), adds a
    batch to the pending sums (:meth:`_accumulate`), solves (:meth:`_solve`)
    and scores (:meth:`_logits`). ``counts`` (per-class example counts) is
    always a statistic; classes with no examples get ``-inf`` logits.

    Stored statistics and the solution are persistent float64 buffers, so
    ``state_dict`` saves them (e.g. with safetensors) and a load restores the
    logits bit for bit (``load_state_dict`` needs a head of the checkpoint's
    shape: :meth:`load_extra_state` resizes it first). Pending sums are plain
    tensors, not buffers: they are local to a process until :meth:`sync`, are
    not saved, and are not broadcast by wrappers such as DistributedDataParallel.
    """

    kind: ClassVar[str] = ""

    def __init__(self, in_features: int, num_classes: int = 0, **settings: Any) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features, minimum=1)
        self._pending: dict[str, torch.Tensor] = {}
        self._configure(**settings)
        self._allocate(check_int("num_classes", num_classes, minimum=0))

    # -- subclass interface -------------------------------------------------------------

    def _configure(self, **settings: Any) -> None:
        """Validate and store the non-tensor settings (constructor keywords).

        Only validates and sets attributes (no buffers, no other methods), so
        :meth:`check_settings` can run it without building a head.
        """

    @classmethod
    def check_settings(cls, **settings: Any) -> None:
        """Raise ``ValueError`` unless ``settings`` (every setting keyword) are valid; allocates nothing."""
        cls._configure(SimpleNamespace(), **settings)  # type: ignore[arg-type]

    def settings(self) -> dict[str, Any]:
        """The non-tensor settings, as constructor keywords (JSON-serialisable)."""
        return {}

    def _statistic_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {}

    def _solution_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {}

    def _allocate_fixed(self, device: torch.device) -> None:
        """Register buffers that do not depend on the number of classes."""

    def _accumulate(
        self, pending: dict[str, torch.Tensor], x: torch.Tensor, onehot: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def _solve(self) -> None:
        raise NotImplementedError

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- public API ---------------------------------------------------------------------

    @property
    def num_classes(self) -> int:
        return self.counts.shape[0]

    def statistic_names(self) -> list[str]:
        """Names of the summed statistics, in the order :meth:`sync` reduces them."""
        return ["counts", *self._statistic_shapes(0)]

    def pending_statistics(self) -> dict[str, torch.Tensor]:
        """This process's not yet synced sums (zeros where nothing is pending)."""
        return {name: self._pending_tensor(name) for name in self.statistic_names()}

    @torch.no_grad()
    def grow(self, n_total: int) -> None:
        """Grow to ``n_total`` classes; existing statistics and solution are unchanged.

        New classes start with zero statistics (and zero solution, which is what a
        solve gives for them), so growing alone changes no finite logit.
        """
        n_total = check_int("n_total", n_total, minimum=0)
        if n_total < self.num_classes:
            raise ValueError(f"cannot shrink the head from {self.num_classes} to {n_total}")
        if n_total == self.num_classes:
            return
        shapes = {**self._class_statistic_shapes(n_total), **self._solution_shapes(n_total)}
        for name, shape in shapes.items():
            setattr(self, name, _padded(getattr(self, name), shape))
        for name, tensor in self._pending.items():
            self._pending[name] = _padded(tensor, shapes[name])

    @torch.no_grad()
    def accumulate(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch to this process's pending sums; predictions change at :meth:`sync`."""
        x, y = self._check_batch(features, labels)
        onehot = nn.functional.one_hot(y, self.num_classes).to(FLOAT)
        pending = {name: self._pending_tensor(name) for name in self.statistic_names()}
        pending["counts"] += onehot.sum(0)
        self._accumulate(pending, x, onehot)
        self._pending = pending

    @torch.no_grad()
    def sync(self, reduce: Reduce | None = None) -> None:
        """Fold the pending sums of all processes into the statistics and re-solve.

        ``reduce`` sums a tensor over processes (``None``: a single process). It
        is called once per statistic, in :meth:`statistic_names` order, even when
        nothing is pending, so every process issues the same collectives; all
        processes must call ``sync`` together, with the same ``num_classes``. It
        may return the sum or, like ``torch.distributed.all_reduce``, sum in place
        and return ``None``.
        """
        for name in self.statistic_names():
            pending = self._pending_tensor(name)
            total = pending if reduce is None else reduce(pending)
            total = pending if total is None else total
            stored = getattr(self, name)
            if total.shape != stored.shape:
                raise ValueError(
                    f"reduce returned shape {tuple(total.shape)} for {name!r}, "
                    f"expected {tuple(stored.shape)}"
                )
            stored.add_(total.to(device=stored.device, dtype=FLOAT))
        self._pending = {}
        self._solve()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, num_classes) logits in ``features``' dtype, at least float32 (bf16 features would round close
        scores into ties at the argmax); classes with no examples get ``-inf``."""
        x = self._check_features(features)
        logits = self._logits(x).masked_fill(self.counts == 0, float("-inf"))
        return logits.to(torch.promote_types(features.dtype, torch.float32))

    def extra_state(self) -> dict[str, Any]:
        """JSON state needed to rebuild this head's shape before ``load_state_dict``.

        ``build_head(**head.extra_state())`` builds a head of the same shape.
        """
        return {
            "kind": self.kind,
            "in_features": self.in_features,
            "num_classes": self.num_classes,
            **self.settings(),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Take the settings of ``state`` and resize every buffer to its shape.

        The statistics are reset to zeros; the ``load_state_dict`` that follows
        fills them. Pending sums are dropped.
        """
        state = dict(state)
        kind = state.pop("kind", self.kind)
        if kind != self.kind:
            raise ValueError(f"state is for a {kind!r} head, not {self.kind!r}")
        in_features = state.pop("in_features", self.in_features)
        if in_features != self.in_features:
            raise ValueError(f"state has in_features={in_features}, head has {self.in_features}")
        num_classes = check_int("num_classes", state.pop("num_classes", 0), minimum=0)
        unknown = sorted(set(state) - set(self.settings()))
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)} for a {self.kind!r} head")
        self._configure(**{**self.settings(), **state})
        self._allocate(num_classes)

    def extra_repr(self) -> str:
        settings = "".join(f", {k}={v!r}" for k, v in self.settings().items())
        return f"in_features={self.in_features}, num_classes={self.num_classes}{settings}"

    # -- helpers --------------------------------------------------------------------------

    def _class_statistic_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {"counts": (k,), **self._statistic_shapes(k)}

    def _allocate(self, num_classes: int) -> None:
        """(Re-)register every buffer as zeros for ``num_classes`` classes."""
        counts = self._buffers.get("counts")
        device = counts.device if counts is not None else torch.device("cpu")
        self._pending = {}
        shapes = {**self._class_statistic_shapes(num_classes), **self._solution_shapes(num_classes)}
        for name, shape in shapes.items():
            self.register_buffer(name, torch.zeros(shape, dtype=FLOAT, device=device))
        self._allocate_fixed(device)

    def _pending_tensor(self, name: str) -> torch.Tensor:
        stored = getattr(self, name)
        pending = self._pending.get(name)
        if pending is None:
            return torch.zeros_like(stored)
        return pending.to(stored.device)

    def _check_features(self, features: torch.Tensor) -> torch.Tensor:
        if features.ndim != 2 or features.shape[1] != self.in_features:
            raise ValueError(
                f"features must have shape (B, {self.in_features}), got {tuple(features.shape)}"
            )
        return features.to(FLOAT)

    def _check_batch(
        self, features: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._check_features(features)
        y = torch.as_tensor(labels, device=x.device)
        if y.ndim != 1 or y.shape[0] != x.shape[0] or y.is_floating_point():
            raise ValueError(
                f"labels must be integer ids of shape ({x.shape[0]},), "
                f"got {tuple(y.shape)} {y.dtype}"
            )
        y = y.long()
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ValueError(
                f"labels must lie in [0, num_classes={self.num_classes}), got "
                f"[{int(y.min())}, {int(y.max())}]; grow the head first"
            )
        return x, y


def _padded(old: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Zeros of ``shape`` with ``old`` copied into the leading corner."""
    new = old.new_zeros(shape)
    new[tuple(slice(0, n) for n in old.shape)] = old
    return new


# -- option validation (clear errors naming the option) -----------------------------------


def check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)
