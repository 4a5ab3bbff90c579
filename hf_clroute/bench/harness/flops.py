"""Counting a forward pass's FLOPs with ``torch.utils.flop_counter`` (machine load cannot move it).

On CPU, attention usually runs in fused kernels (``nn.MultiheadAttention``'s fast
path, SDPA's flash kernel) that ``FlopCounterMode`` does not see, so a count would
silently leave attention out. :func:`count_flops` routes attention through the
math path (plain matmuls) while counting.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


@contextmanager
def countable_attention() -> Iterator[None]:
    """Attention as plain matmuls for the duration (the previous fast-path setting is restored)."""
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def count_flops(module: nn.Module, *args: Any, **kwargs: Any) -> int:
    """FLOPs of one ``module(*args, **kwargs)`` forward without gradients, attention included."""
    with countable_attention(), FlopCounterMode(display=False) as counter, torch.no_grad():
        module(*args, **kwargs)
    return counter.get_total_flops()
