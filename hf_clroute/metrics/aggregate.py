"""Mean ± std across seeds (SPEC 4: "report every figure as mean ± std over seeds")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np


def mean_std(values: Sequence[float | None] | np.ndarray) -> dict[str, float] | None:
    """``{"mean", "std"}`` of ``values``, or None when every value is None.

    ``None`` values (a metric undefined for a run, e.g. FWT in class-IL) are
    skipped. ``std`` is the *sample* standard deviation (``ddof=1``, the usual
    choice for a handful of seeds) when n > 1, and 0.0 when n == 1. Raises
    ``ValueError`` for empty or non-finite input.
    """
    if not isinstance(values, np.ndarray):
        values = list(values)
        if not values:
            raise ValueError("mean_std needs at least one value")
        values = [v for v in values if v is not None]
        if not values:
            return None
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("mean_std needs at least one value")
    if not np.all(np.isfinite(arr)):
        raise ValueError("mean_std values must be finite")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std}


def aggregate_runs(runs: Iterable[Mapping[str, float | None]]) -> dict[str, dict[str, float] | None]:
    """Per key, ``mean_std`` over the runs (e.g. one ``summarize`` dict per seed).

    ``None`` values are skipped; a key that is None in every run where it
    appears aggregates to None (so an undefined metric reads as n/a, not as
    missing). Keys keep their first-seen order.
    """
    collected: dict[str, list[float | None]] = {}
    for run in runs:
        for key, value in run.items():
            collected.setdefault(key, []).append(None if value is None else float(value))
    return {key: mean_std(vals) for key, vals in collected.items()}
