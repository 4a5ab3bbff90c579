"""A linear classification head that grows with the classes of a stream.

Class-incremental learning keeps one head over all classes seen so far. When a
task brings new classes the head grows; the old rows must stay bit-identical
so growing alone never changes a prediction over old classes.

Growing replaces the ``weight``/``bias`` Parameters (a tensor cannot be
resized in place under autograd), so an optimizer built before ``grow`` holds
stale tensors: the engine rebuilds the optimizer at every task start, after
growing the head.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

ActiveClasses = torch.Tensor | Iterable[int] | str | None


class IncrementalClassifier(nn.Module):
    """``logits = features @ weight.T + bias`` over ``num_classes`` outputs.

    New output rows are drawn from nn.Linear's default init distribution,
    U(-1/sqrt(in_features), 1/sqrt(in_features)) for weight and bias, using
    ``generator`` when given (deterministic: same generator state, same rows)
    or the global torch RNG otherwise.

    ``seen`` (a persistent buffer) marks classes that have had a training
    label (:meth:`observe`); ``forward(..., active_classes="seen")`` masks the
    logits of the other classes to ``-inf``.
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int = 0,
        *,
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.empty(0, in_features))
        self.bias = nn.Parameter(torch.empty(0)) if bias else None
        self.register_buffer("seen", torch.zeros(0, dtype=torch.bool))
        # A checkpoint of a larger head loads into a smaller one by growing it first.
        self.register_load_state_dict_pre_hook(_grow_to_checkpoint)
        self.grow(num_classes, generator=generator)

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    def grow(self, n_total: int, generator: torch.Generator | None = None) -> None:
        """Grow to ``n_total`` outputs; existing rows are kept bit-identical."""
        n_new = n_total - self.num_classes
        if n_new < 0:
            raise ValueError(f"cannot shrink the head from {self.num_classes} to {n_total}")
        if n_new == 0:
            return
        self.weight = self._extended(self.weight, (n_new, self.in_features), generator)
        if self.bias is not None:
            self.bias = self._extended(self.bias, (n_new,), generator)
        self.seen = torch.cat([self.seen, self.seen.new_zeros(n_new)])

    def _extended(
        self, old: nn.Parameter, new_shape: tuple[int, ...], generator: torch.Generator | None
    ) -> nn.Parameter:
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        new = torch.rand(new_shape, generator=generator, dtype=old.dtype, device="cpu")
        new = (new * 2 - 1).mul_(bound).to(old.device)
        return nn.Parameter(torch.cat([old.detach(), new]), requires_grad=old.requires_grad)

    @torch.no_grad()
    def observe(self, labels: torch.Tensor | Iterable[int]) -> None:
        """Mark the classes in ``labels`` as seen (grow the head first)."""
        ids = _as_ids(labels, self.seen.device)
        if ids.numel() and int(ids.max()) >= self.num_classes:
            raise ValueError(
                f"label {int(ids.max())} >= num_classes {self.num_classes}; grow first"
            )
        self.seen[ids] = True

    def class_mask(self, active_classes: ActiveClasses) -> torch.Tensor | None:
        """Boolean (num_classes,) mask of the classes whose logits stay finite.

        ``None``: all; ``"seen"``: the observed ones; a bool tensor of shape
        (num_classes,) as is; otherwise an iterable of class ids (e.g. the
        current task's classes for "masked" training).
        """
        if active_classes is None:
            return None
        if isinstance(active_classes, str):
            if active_classes != "seen":
                raise ValueError(
                    f"active_classes must be 'seen', ids or a mask, not {active_classes!r}"
                )
            return self.seen
        if torch.is_tensor(active_classes) and active_classes.dtype == torch.bool:
            return active_classes.to(self.weight.device)
        mask = torch.zeros(self.num_classes, dtype=torch.bool, device=self.weight.device)
        mask[_as_ids(active_classes, mask.device)] = True
        return mask

    def forward(
        self, features: torch.Tensor, active_classes: ActiveClasses = None
    ) -> torch.Tensor:
        """(B, num_classes) logits; inactive classes get ``-inf``."""
        logits = nn.functional.linear(features, self.weight, self.bias)
        mask = self.class_mask(active_classes)
        return logits if mask is None else logits.masked_fill(~mask, float("-inf"))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, "
            f"bias={self.bias is not None}"
        )


def _as_ids(classes: torch.Tensor | Iterable[int], device: torch.device) -> torch.Tensor:
    """Class ids as a long tensor on ``device``."""
    ids = classes if torch.is_tensor(classes) else torch.tensor(list(classes), dtype=torch.long)
    return ids.to(device=device, dtype=torch.long)


def _grow_to_checkpoint(
    module: IncrementalClassifier, state_dict: dict, prefix: str, *args: object
) -> None:
    stored = state_dict.get(prefix + "weight")
    if stored is not None and stored.shape[0] > module.num_classes:
        module.grow(stored.shape[0])


def task_mask_logits(logits: torch.Tensor, classes: list[int] | None) -> torch.Tensor:
    """Keep only ``classes`` in the softmax (task-incremental evaluation; current-task training losses)."""
    if classes is None:
        return logits
    mask = torch.full_like(logits, float("-inf"))
    mask[:, classes] = 0.0
    return logits + mask
