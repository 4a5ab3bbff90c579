"""Build a head by kind name (the config / checkpoint side of the heads)."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from .lda import StreamingLDAHead
from .linear import IncrementalClassifier
from .prototype import PrototypeHead
from .ranpac import RandomProjectionRidgeHead

HEAD_CLASSES: dict[str, type[nn.Module]] = {
    "linear": IncrementalClassifier,
    PrototypeHead.kind: PrototypeHead,
    StreamingLDAHead.kind: StreamingLDAHead,
    RandomProjectionRidgeHead.kind: RandomProjectionRidgeHead,
}
HEAD_KINDS: tuple[str, ...] = tuple(HEAD_CLASSES)


def build_head(kind: str, in_features: int, **options: Any) -> nn.Module:
    """A head of ``kind`` ("linear", "prototype", "lda" or "ranpac") over ``in_features``.

    ``options`` are the head's constructor keywords (e.g. ``num_classes``,
    ``shrinkage``); an unknown kind or option raises ``ValueError``.
    """
    if kind not in HEAD_CLASSES:
        raise ValueError(f"unknown head kind {kind!r}; known kinds: {', '.join(HEAD_KINDS)}")
    cls = HEAD_CLASSES[kind]
    allowed = [name for name in inspect.signature(cls).parameters if name != "in_features"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for head kind {kind!r}; "
            f"allowed: {', '.join(allowed)}"
        )
    return cls(in_features, **options)
