"""Mean ± std across seeds (SPEC 4: "report every figure as mean ± std over seeds")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np


def mean_std(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``{"mean", "std"}`` of ``values``.

    ``std`` is the *sample* standard deviation (``ddof=1``, the usual choice for
    a handful of seeds) when n > 1, and 0.0 when n == 1. Raises ``ValueError``
    for empty or non-finite input.
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("mean_std needs at least one value")
    if not np.all(np.isfinite(arr)):
        raise ValueError("mean_std values must be finite")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std}


def aggregate_runs(runs: Iterable[Mapping[str, float | None]]) -> dict[str, dict[str, float]]:
    """Per key, ``mean_std`` over the runs (e.g. one ``summarize`` dict per seed).

    ``None`` values are skipped; a key that is None (or absent) in every run is
    left out. Keys keep their first-seen order.
    """
    collected: dict[str, list[float]] = {}
    for run in runs:
        for key, value in run.items():
            bucket = collected.setdefault(key, [])
            if value is not None:
                bucket.append(float(value))
    return {key: mean_std(vals) for key, vals in collected.items() if vals}
