"""A normalised (cosine) linear head that grows with the classes of a stream.

``logits = s * cos(w_c, f)``: each class row and the features are scaled to unit
length before the dot product, so a logit does not depend on the feature norm
or on a row's norm, only on their angle. Under a shared class-IL head trained by
current-task cross-entropy, the rows of new classes are never trained against
old ones; with a plain linear head whichever rows grew largest win the argmax
(the recency or first-task bias), while here no row can win by its norm alone.

``s`` is one scalar shared by every class, so it never changes the argmax; it
sets the softmax temperature the loss trains under. It is learned by default
from ``scale`` (``s = scale * exp(t)`` with ``t`` a trained scalar starting at
0, so AdamW's weight decay pulls it back toward ``scale``, not toward 0), or
fixed at ``scale`` with ``learn_scale=False`` (a buffer, never trained).

Growing keeps old rows bit-identical and draws new rows like
:class:`~hf_clroute.heads.linear.IncrementalClassifier` (same distribution,
same generator use), so the engine's growth and checkpoint paths treat both
heads alike: grow to the saved size, then load the tensors.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import nn

from hf_clroute.heads.linear import IncrementalClassifier

#: the default initial scale: a 0.1 gap in cosine is a 1.6 gap in logits
DEFAULT_SCALE = 16.0


class CosineClassifier(IncrementalClassifier):
    """``logits = s * normalize(features) @ normalize(weight).T`` over ``num_classes`` outputs, no bias.

    ``scale`` (> 0) is the initial (``learn_scale=True``) or fixed scale ``s``. New rows come from
    U(-1/sqrt(in_features), 1/sqrt(in_features)) drawn with ``generator`` (or the global RNG).
    """

    kind = "cosine"

    def __init__(
        self,
        in_features: int,
        num_classes: int = 0,
        *,
        scale: float = DEFAULT_SCALE,
        learn_scale: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        scale = check_scale(scale)
        if not isinstance(learn_scale, bool):
            raise ValueError(f"learn_scale must be true or false, got {learn_scale!r}")
        super().__init__(in_features, num_classes, bias=False, generator=generator)
        self.scale, self.learn_scale = scale, learn_scale
        if learn_scale:
            self.log_scale_offset = nn.Parameter(torch.zeros(()))
        else:
            self.register_buffer("log_scale_offset", torch.zeros(()))  # saved, never trained

    @property
    def current_scale(self) -> torch.Tensor:
        """``s`` as a 0-d tensor: ``scale * exp(log_scale_offset)`` (the offset stays 0 when fixed)."""
        return self.log_scale_offset.exp() * self.scale

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, num_classes) logits ``s * cos(weight_c, features)``; a zero feature or row scores 0."""
        f = nn.functional.normalize(features, dim=-1)
        w = nn.functional.normalize(self.weight, dim=-1).to(f.dtype)
        return nn.functional.linear(f, w) * self.current_scale.to(f.dtype)

    def settings(self) -> dict[str, Any]:
        """The constructor keywords that are not sizes (what ``head_options`` holds)."""
        return {"scale": self.scale, "learn_scale": self.learn_scale}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, "
            f"scale={self.scale}, learn_scale={self.learn_scale}"
        )


def check_scale(value: Any) -> float:
    """``value`` as a float, or ``ValueError`` naming ``scale`` unless it is a finite number > 0."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"scale must be a finite number > 0, got {value!r}")
    return float(value)
