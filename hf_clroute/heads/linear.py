"""A linear classification head that grows with the classes of a stream.

Class-incremental learning keeps one head over all classes seen so far. When a
task brings new classes the head grows; the old rows must stay bit-identical
so growing alone never changes a prediction over old classes.

Growing replaces the ``weight``/``bias`` Parameters (a tensor cannot be
resized in place under autograd), so an optimizer built before ``grow`` holds
stale tensors: the engine rebuilds the optimizer at every task start, after
growing the head.

``load_state_dict`` needs a head of the checkpoint's size: grow it first
(``CLModel.load_extra_state`` does, from the saved number of classes).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class IncrementalClassifier(nn.Module):
    """``logits = features @ weight.T + bias`` over ``num_classes`` outputs.

    New output rows are drawn from nn.Linear's default init distribution,
    U(-1/sqrt(in_features), 1/sqrt(in_features)) for weight and bias, using
    ``generator`` when given (deterministic: same generator state, same rows)
    or the global torch RNG otherwise.
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

    def _extended(
        self, old: nn.Parameter, new_shape: tuple[int, ...], generator: torch.Generator | None
    ) -> nn.Parameter:
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        new = torch.rand(new_shape, generator=generator, dtype=old.dtype, device="cpu")
        new = (new * 2 - 1).mul_(bound).to(old.device)
        return nn.Parameter(torch.cat([old.detach(), new]), requires_grad=old.requires_grad)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, num_classes) logits."""
        return nn.functional.linear(features, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, "
            f"bias={self.bias is not None}"
        )


def task_mask_logits(logits: torch.Tensor, classes: list[int] | None) -> torch.Tensor:
    """Keep only ``classes`` in the softmax (task-incremental evaluation; current-task training losses)."""
    if classes is None:
        return logits
    mask = torch.full_like(logits, float("-inf"))
    mask[:, classes] = 0.0
    return logits + mask
