"""Build a head by kind name (the config / checkpoint side of the heads)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from hf_clroute.heads.base import StatisticsHead, check_int
from hf_clroute.heads.cosine import CosineClassifier
from hf_clroute.heads.lda import StreamingLDAHead
from hf_clroute.heads.linear import IncrementalClassifier
from hf_clroute.heads.prototype import PrototypeHead
from hf_clroute.heads.ranpac import RandomProjectionRidgeHead

HEAD_CLASSES: dict[str, type[nn.Module]] = {
    "linear": IncrementalClassifier,
    PrototypeHead.kind: PrototypeHead,
    StreamingLDAHead.kind: StreamingLDAHead,
    RandomProjectionRidgeHead.kind: RandomProjectionRidgeHead,
    CosineClassifier.kind: CosineClassifier,
}
HEAD_KINDS: tuple[str, ...] = tuple(HEAD_CLASSES)
#: the heads a method's loss trains by gradient ("linear", "cosine"); the others are closed-form statistics heads
GRADIENT_HEAD_KINDS: tuple[str, ...] = tuple(k for k, c in HEAD_CLASSES.items() if not issubclass(c, StatisticsHead))
STATISTICS_HEAD_KINDS: tuple[str, ...] = tuple(k for k in HEAD_KINDS if k not in GRADIENT_HEAD_KINDS)


def head_parameters(kind: str) -> dict[str, inspect.Parameter]:
    """The constructor keywords of a ``kind`` head (all but ``in_features``), with their defaults."""
    if kind not in HEAD_CLASSES:
        raise ValueError(f"unknown head kind {kind!r}; known kinds: {', '.join(HEAD_KINDS)}")
    params = inspect.signature(HEAD_CLASSES[kind]).parameters
    return {name: p for name, p in params.items() if name != "in_features"}


def check_head_options(kind: str, options: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` (naming the option) unless ``options`` are valid for a ``kind`` head.

    Builds no head: a statistics head's settings are checked as its constructor
    checks them, so a large one (a RanPAC Gram matrix) is never allocated.
    """
    allowed = head_parameters(kind)
    _check_known(kind, options, allowed)
    cls = HEAD_CLASSES[kind]
    if issubclass(cls, StatisticsHead):
        defaults = {n: p.default for n, p in allowed.items() if n != "num_classes"}
        cls.check_settings(**{**defaults, **{n: v for n, v in options.items() if n != "num_classes"}})
        if "num_classes" in options:
            check_int("num_classes", options["num_classes"], minimum=0)
    else:
        cls(1, **options)  # a linear or cosine head with no outputs yet costs nothing


def build_head(kind: str, in_features: int, **options: Any) -> nn.Module:
    """A head of ``kind`` ("linear", "cosine", "prototype", "lda" or "ranpac") over ``in_features``.

    ``options`` are the head's constructor keywords (e.g. ``num_classes``,
    ``shrinkage``, ``scale``); an unknown kind or option raises ``ValueError``.
    """
    _check_known(kind, options, head_parameters(kind))
    return HEAD_CLASSES[kind](in_features, **options)


def _check_known(kind: str, options: Mapping[str, Any], allowed: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for head kind {kind!r}; "
            f"allowed: {', '.join(allowed)}"
        )
