"""Mean ± std across seeds: every reported figure is a mean ± std over seeds."""

from __future__ import annotations

import math
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


def format_mean_std(stat: Mapping[str, float] | None, n: int | None = None, scale: float = 100.0,
                    digits: int = 1, missing: str = "—", mark_one_seed: bool = True) -> str:
    """``stat`` (a :func:`mean_std` dict) as "mean ± std", scaled (100: a fraction as %).

    ``n`` is how many seeds it aggregates, where the caller knows: one seed has no spread, so it
    reads "mean (one seed)" rather than "± 0.0", or the bare "mean" with ``mark_one_seed=False``, for
    a table whose caption says it once (:func:`seeds_caption`). ``missing`` stands for an undefined figure.
    """
    if not stat:
        return missing
    mean = f"{stat['mean'] * scale:.{digits}f}"
    if n == 1:
        return f"{mean} (one seed)" if mark_one_seed else mean
    return f"{mean} ± {stat['std'] * scale:.{digits}f}"


def one_seed_only(seed_counts: Iterable[int | None]) -> bool:
    """Whether every row of a table aggregates exactly one seed (rows of unknown count: not one seed)."""
    counts = list(seed_counts)
    return bool(counts) and all(n == 1 for n in counts)


def seeds_caption(one_seed: bool) -> str:
    """How a table's figures read, said once in its caption: one seed's values, or mean ± std over seeds."""
    return "one seed: each figure is that seed's value (no spread)" if one_seed else "mean ± std over seeds"


#: a paired verdict needs at least this many seeds; below it the verdict says "too few seeds".
MIN_PAIRED_SEEDS = 5


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], alpha: float = 0.05,
                      min_seeds: int = MIN_PAIRED_SEEDS) -> dict | None:
    """Per-seed paired comparison of ``a`` and ``b`` (``{seed: value}``, e.g. A_T of a method and its control).

    Both runs of a seed share its stream, so the difference is taken seed by seed over the seeds both
    have: ``mean`` and ``std`` (sample) of ``a - b``, ``wins`` (seeds where ``a > b``; equal up to float
    rounding is no win) of ``n``, the paired t statistic ``t = mean / (std / sqrt(n))`` and its two-sided
    ``p`` (Student t, n - 1 degrees of freedom), and ``verdict``: "better" / "worse" when ``p < alpha``
    with at least ``min_seeds`` seeds, "tie" otherwise, "too few seeds" below ``min_seeds``. None when no
    seed is shared.
    """
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    diff = np.array([a[s] - b[s] for s in seeds], dtype=np.float64)
    # Equal scores stored through different arithmetic (0.4565 and 0.45649999999999996, or scaled to %)
    # are a tie, not a win for whichever rounding came out higher.
    diff[np.abs(diff) < 1e-9] = 0.0
    n, mean = len(diff), float(diff.mean())
    std = float(diff.std(ddof=1)) if n > 1 else 0.0
    t = p = None
    if n > 1 and std > 0:
        t = mean / (std / math.sqrt(n))
        p = t_two_sided_p(t, n - 1)
    elif n > 1:  # every seed gives the same difference: certain unless it is zero
        p = 1.0 if mean == 0 else 0.0
    if n < min_seeds:
        verdict = "too few seeds"
    else:
        verdict = ("better" if mean > 0 else "worse") if p is not None and p < alpha else "tie"
    return {"seeds": seeds, "n": n, "mean": mean, "std": std, "wins": int((diff > 0).sum()),
            "t": t, "p": p, "verdict": verdict}


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer ``df`` degrees of freedom, exactly.

    The closed form for integer degrees of freedom (a finite series in cos(theta), theta =
    atan(|t| / sqrt(df))), so no special-function library is needed.
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    # P(|T| < |t|) = sin(theta) * S (even df), or 2 / pi * (theta + sin(theta) cos(theta) S) (odd df), with
    # S = 1 + (1/2) c2 + (1*3)/(2*4) c2^2 + ... (even), 1 + (2/3) c2 + (2*4)/(3*5) c2^2 + ... (odd), c2 = cos^2
    term, total = 1.0, 1.0
    for k in range(2 if df % 2 == 0 else 3, df, 2):
        term *= c2 * (k - 1) / k
        total += term
    if df % 2 == 0:
        inside = math.sin(theta) * total
    else:
        inside = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    return float(min(1.0, max(0.0, 1.0 - inside)))


def binomial_se(accuracy: float, n_test: int) -> float:
    """Test-sampling standard error of an accuracy measured on ``n_test`` examples: sqrt(p (1 - p) / N)."""
    if n_test < 1:
        raise ValueError(f"n_test must be >= 1, got {n_test}")
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n_test)
