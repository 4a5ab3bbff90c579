"""Continual-learning metrics over an accuracy matrix.

All functions are pure and take array-likes; nothing is mutated.

Conventions
-----------
* ``R`` is a ``T x T`` accuracy matrix, 0-based: ``R[t][j]`` is the accuracy
  on task ``j``'s test split after training on task ``t``. The papers write the
  same definitions 1-based (``R[T][j]`` is the last row); here the last row is
  ``R[T-1]``.
* Accuracies are **fractions in [0, 1]**, not percentages. Every entry of
  ``R`` must be finite and in range, including entries for tasks not yet
  trained (``j > t``), which are still evaluated (they feed FWT).
* Invalid input raises ``ValueError`` with a message naming the argument and
  the problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

ArrayLike = Sequence[Sequence[float]] | Sequence[float] | np.ndarray

SUMMARY_KEYS: tuple[str, ...] = ("A_T", "A_bar", "F_T", "BWT", "FWT", "A_AUC")

#: The continual-learning scenarios: class-, domain- and task-incremental.
SCENARIOS: tuple[str, ...] = ("class", "domain", "task")


# --------------------------------------------------------------------- validation
def _as_array(values: Any, name: str, ndim: int) -> np.ndarray:
    """``values`` as a finite, non-empty float64 array with ``ndim`` dimensions."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric {ndim}-D array (ragged or non-numeric input): {exc}") from exc
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return arr


def _check_fractions(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError(
            f"{name} values must be accuracies as fractions in [0, 1], "
            f"got min={arr.min():g}, max={arr.max():g} (percentages? divide by 100)"
        )
    return arr


def _square(values: Any, name: str) -> np.ndarray:
    arr = _as_array(values, name, ndim=2)
    if arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be square (T x T), got shape {arr.shape}")
    return arr


def _accuracy_matrix(R: ArrayLike) -> np.ndarray:
    """Validate ``R``: square, non-empty, finite, entries in [0, 1]."""
    return _check_fractions(_square(R, "R"), "R")


def _untrained(b: ArrayLike, num_tasks: int) -> np.ndarray:
    """Validate ``b``: length ``T``, finite, entries in [0, 1]."""
    arr = _check_fractions(_as_array(b, "b", ndim=1), "b")
    if arr.shape[0] != num_tasks:
        raise ValueError(f"b must have one entry per task (length {num_tasks}), got length {arr.shape[0]}")
    return arr


def _perplexity_matrix(P: ArrayLike) -> np.ndarray:
    """Validate ``P``: square, non-empty, finite, entries > 0."""
    arr = _square(P, "P")
    if arr.min() <= 0.0:
        raise ValueError(f"P values are perplexities and must be > 0, got min={arr.min():g}")
    return arr


# ------------------------------------------------------------------ accuracy metrics
def final_average_accuracy(R: ArrayLike) -> float:
    """A_T = mean over j of R[T-1][j], the final average accuracy."""
    return float(_accuracy_matrix(R)[-1].mean())


def average_incremental_accuracy(R: ArrayLike) -> float:
    """Ā = mean over t of (mean over j <= t of R[t][j]) (Rebuffi et al. 2017).

    Only the tasks seen so far (the lower triangle, diagonal included) count.
    """
    arr = _accuracy_matrix(R)
    return float(np.mean([arr[t, : t + 1].mean() for t in range(arr.shape[0])]))


def forgetting(R: ArrayLike, *, include_before_learned: bool = False) -> float:
    """F_T = mean over j < T-1 of (max over l of R[l][j]) - R[T-1][j].

    Chaudhry et al. 2018 (RWalk): "max over l<T", 1-based, i.e. rows ``0 .. T-2``
    here. Which rows ``l`` enter the max:

    * default (``include_before_learned=False``): ``l in {j, ..., T-2}`` -- only
      the rows after task ``j`` has been learned. Rows ``l < j`` measure the
      model *before* it saw task ``j`` (forward transfer / chance level); an
      accuracy there is not knowledge that can be forgotten.
    * ``include_before_learned=True``: ``l in {0, ..., T-2}`` -- the literal text
      of Chaudhry et al. (``max over l in {1..k-1}``).

    The two agree whenever no pre-training accuracy ``R[l][j]`` (``l < j``)
    exceeds every ``R[l'][j]`` with ``j <= l' <= T-2`` -- always in
    class-incremental settings, where unseen classes score 0. Both include the
    diagonal ``R[j][j]``, hence ``F_T >= -BWT`` always. Returns 0.0 for T = 1.
    F_T is negative only if the final model beats every earlier score on
    average (backward transfer past the best so far).
    """
    arr = _accuracy_matrix(R)
    last = arr.shape[0] - 1
    if last == 0:
        return 0.0
    drops = [arr[0 if include_before_learned else j : last, j].max() - arr[last, j] for j in range(last)]
    return float(np.mean(drops))


def backward_transfer(R: ArrayLike) -> float:
    """BWT = mean over j < T-1 of R[T-1][j] - R[j][j] (Lopez-Paz & Ranzato 2017).

    Negative values mean forgetting. Returns 0.0 for T = 1.
    """
    arr = _accuracy_matrix(R)
    last = arr.shape[0] - 1
    if last == 0:
        return 0.0
    return float(np.mean(arr[last, :last] - np.diag(arr)[:last]))


def forward_transfer(R: ArrayLike, b: ArrayLike) -> float:
    """FWT = mean over j >= 1 of R[j-1][j] - b[j] (Lopez-Paz & Ranzato 2017).

    ``b[j]`` is the accuracy of the untrained model on task ``j`` (length T;
    ``b[0]`` is required for shape but unused). The paper's "j >= 2" is 1-based.
    Returns 0.0 for T = 1.
    """
    arr = _accuracy_matrix(R)
    base = _untrained(b, arr.shape[0])
    if arr.shape[0] == 1:
        return 0.0
    return float(np.mean(np.diag(arr, k=1) - base[1:]))


def anytime_accuracy(evals: Sequence[float] | np.ndarray) -> float:
    """A_AUC = mean of the periodic evaluations during the stream (Koh et al. 2022).

    Each entry of ``evals`` is one evaluation every N steps, itself already the
    average accuracy over the tasks seen so far (a fraction in [0, 1]).
    """
    return float(_check_fractions(_as_array(evals, "anytime", ndim=1), "anytime").mean())


def summarize(
    R: ArrayLike,
    b: ArrayLike | None = None,
    anytime: Sequence[float] | np.ndarray | None = None,
    *,
    scenario: str = "class",
) -> dict[str, float | None]:
    """All accuracy metrics: keys ``A_T, A_bar, F_T, BWT, FWT, A_AUC``.

    ``scenario`` is one of :data:`SCENARIOS`. In class-incremental runs
    (``"class"``) task ``j``'s classes cannot be predicted before task ``j``
    is trained (their head outputs are untrained, and masked where the
    method masks unseen classes), so ``R[j-1][j]`` measures no transfer and
    ``FWT`` is None there. For ``"domain"`` and ``"task"`` it is
    :func:`forward_transfer`, and None without ``b``. ``A_AUC`` is None
    without ``anytime``. ``R`` is validated in every case.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
    fwt = None if b is None or scenario == "class" else forward_transfer(R, b)
    return {
        "A_T": final_average_accuracy(R),
        "A_bar": average_incremental_accuracy(R),
        "F_T": forgetting(R),
        "BWT": backward_transfer(R),
        "FWT": fwt,
        "A_AUC": None if anytime is None else anytime_accuracy(anytime),
    }


# ------------------------------------------------------------- language models
def retention(P: ArrayLike, domain: int, after: int) -> float:
    """Perplexity retention of ``domain`` after training on ``after``.

    ``P[t][d]`` is the perplexity on domain ``d`` after training on domain
    ``t``. retention = P[after][domain] / P[domain][domain]; e.g. domain 0 after
    domain 1 is ``P[1][0] / P[0][0]``. 1.0 = unchanged, > 1 = forgot (perplexity
    rose). Requires ``0 <= domain <= after < T``.
    """
    arr = _perplexity_matrix(P)
    if not 0 <= domain <= after < arr.shape[0]:
        raise ValueError(f"need 0 <= domain <= after < T={arr.shape[0]}, got domain={domain}, after={after}")
    return float(arr[after, domain] / arr[domain, domain])


def perplexity_retention(P: ArrayLike) -> dict[str, Any]:
    """Summary of perplexity retention after the last domain.

    Returns ``retention`` (list, ``retention(P, d, T-1)`` for each d < T-1),
    ``mean_retention`` (their mean; 1.0 for T = 1, nothing to forget) and
    ``final_perplexity`` (list, ``P[T-1]``, perplexity per domain at the end).
    """
    arr = _perplexity_matrix(P)
    last = arr.shape[0] - 1
    ratios = [retention(arr, d, last) for d in range(last)]
    return {
        "retention": ratios,
        "mean_retention": float(np.mean(ratios)) if ratios else 1.0,
        "final_perplexity": [float(x) for x in arr[last]],
    }
