"""SGSE: a sequential test that decides when the slot memory needs a new slot.

The router's top-slot confidence s_t is high for inputs the slots cover and
drops for novel ones. A fixed threshold on s_t is brittle (its scale drifts as
the memory trains), so SGSE compares each s_t with a *tracked* level instead:

* q_t is the eps-quantile of the last w confidences (the level a 1 - eps share
  of them reach) and Q_t = beta Q_{t-1} + (1 - beta) q_t smooths it;
* each new input is a Bernoulli trial, success = {s_t >= Q_{t-1}} (compared with
  the level *before* s_t is folded in); on a stationary stream the success rate
  is about 1 - eps;
* every n trials (disjoint blocks, so each test sees fresh trials) the
  one-sided Wilson lower bound of the block's success rate is computed, and a
  slot is added when it falls below ``threshold``. By default the threshold is
  derived from ``alpha``: the largest one for which a Binomial(n, 1 - eps) block
  expands with probability <= alpha, which bounds the false-expansion rate
  per test on a stationary stream;
* the new key is the mean query of the recent low-confidence inputs (failures).

After an abrupt drop in confidence, Q_t lags by about 1 / (1 - beta) trials, so
the block that sees the shift fails en masse: detection within 2n trials.

That lag is also the tracked level's weakness; ``reference > 0`` (ours) tests each block
against a calibrated level instead (:class:`ExpansionTest`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def wilson_lower_bound(successes: int, trials: int, z: float) -> float:
    """One-sided Wilson score lower confidence bound of a Bernoulli rate."""
    if trials <= 0:
        raise ValueError("wilson_lower_bound needs at least one trial")
    p = successes / trials
    z2 = z * z
    centre = p + z2 / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    return max(0.0, (centre - spread) / (1 + z2 / trials))


def binomial_cdf(x: int, n: int, p: float) -> float:
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(x + 1))


def beta_binomial_cdf(x: int, n: int, a: float, b: float) -> float:
    """P(X <= x) for X ~ BetaBinomial(n, a, b)."""
    def log_pmf(j: int) -> float:
        return (math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                + math.lgamma(j + a) + math.lgamma(n - j + b) - math.lgamma(n + a + b)
                - math.lgamma(a) - math.lgamma(b) + math.lgamma(a + b))
    return sum(math.exp(log_pmf(j)) for j in range(x + 1))


def reference_success_cdf(n: int, reference: int, rank: int):
    """CDF of the successes in a block of n trials against the (rank + 1)-th smallest of
    ``reference`` exchangeable values: failures are BetaBinomial(n, k, R + 1 - k), k = rank + 1."""
    k = rank + 1
    return lambda x: 1.0 - beta_binomial_cdf(n - x - 1, n, k, reference + 1 - k) if x < n else 1.0


def threshold_for_cdf(n: int, z: float, cdf, alpha: float) -> tuple[float, float]:
    """(threshold, exact false-expansion probability) for ``LB < threshold`` tests, where
    ``cdf(x)`` = P(successes <= x) on a stationary stream.

    The Wilson bound increases with the success count, so ``LB(X) < threshold``
    is ``X <= x*``; pick the largest x* with P(X <= x*) <= alpha.
    """
    best = None
    for x in range(n + 1):
        if cdf(x) > alpha:
            break
        best = x
    if best is None:
        raise ValueError(
            f"no expansion threshold reaches alpha={alpha} with n={n} trials (even 0 successes in "
            f"{n} has probability {cdf(0):.3g}); raise alpha or n"
        )
    threshold = wilson_lower_bound(best + 1, n, z) if best < n else 1.0
    return threshold, cdf(best)


def threshold_for_alpha(n: int, z: float, success_rate: float, alpha: float) -> tuple[float, float]:
    """:func:`threshold_for_cdf` for independent trials: successes ~ Binomial(n, success_rate)."""
    return threshold_for_cdf(n, z, lambda x: binomial_cdf(x, n, success_rate), alpha)


class ExpansionTest(nn.Module):
    """Feed it (confidence, query) per input; it says when to add a slot and with which key.

    All state is either JSON (:meth:`state`) or the ``pool`` buffer (the recent
    low-confidence queries), so a saved adapter continues the test exactly.

    The tracked level lags: with w = 10 and beta = 0.9 it follows the stream within about
    one batch, so a moderate shift (new classes on the same backbone) is absorbed before a
    block of n = 20 trials sees enough failures. ``reference > 0`` (ours) replaces Q_t by a
    *calibrated* level: the eps-quantile of the last R statistics before the block (the k-th
    smallest, k = floor(eps (R + 1))), held fixed for the block's n trials. On a stationary
    (exchangeable) stream the number of failures in a block is then exactly
    BetaBinomial(n, k, R + 1 - k) for any continuous statistic (the level's exceedance
    probability is a uniform order statistic), so the threshold computed from that law bounds
    the false-expansion probability per test by alpha without assuming a distribution. After a
    shift the reference still describes the old distribution for R inputs, so the first block
    wholly after the shift is tested against it: if most shifted inputs fall below the old
    eps-quantile, SGSE fires within 2n trials of the shift.
    """

    def __init__(
        self,
        query_dim: int,
        beta: float = 0.9,
        window: int = 10,
        eps: float = 0.1,
        trials: int = 20,
        z: float = 1.645,
        alpha: float = 0.05,
        threshold: float | None = None,
        reference: int = 0,
    ) -> None:
        super().__init__()
        self.beta, self.window, self.eps, self.trials, self.z = beta, window, eps, trials, z
        self.reference = reference
        # The level is the k-th smallest of the last w confidences (of the R reference values
        # with ``reference``), k = floor(eps (w + 1)): a new draw from the same distribution
        # reaches it with probability 1 - k / (w + 1) ~ 1 - eps for any continuous distribution
        # (an interpolated quantile of 10 values is biased up).
        size = reference or window
        self.rank = min(size, max(1, math.floor(eps * (size + 1)))) - 1
        if reference:
            cdf = reference_success_cdf(trials, reference, self.rank)
            derived, self.false_expansion_bound = threshold_for_cdf(trials, z, cdf, alpha)
        else:
            derived, self.false_expansion_bound = threshold_for_alpha(trials, z, 1.0 - eps, alpha)
        self.threshold = derived if threshold is None else threshold
        # The pool holds the failures of the current block (at most n of them).
        self.register_buffer("pool", torch.zeros(trials, query_dim))
        self.reset()

    def reset(self) -> None:
        self.recent: deque[float] = deque(maxlen=self.reference or self.window)
        self.pending: list[float] = []  # the current block's values (``reference`` only)
        self.level: float | None = None  # Q_t, or the reference quantile
        self.successes = 0
        self.block = 0
        self.pool_size = 0
        self.tests = 0
        self.expansions = 0
        self.new_key: torch.Tensor | None = None

    @property
    def ready(self) -> bool:
        """Trials start once the window is full and Q_t has a value."""
        return self.level is not None

    def observe(self, confidence: float, query: torch.Tensor | None = None) -> bool:
        """One input (its top-slot confidence and router query); True when a slot should be added,
        with its key (unit norm, None if no query was given) in :attr:`new_key`."""
        expand = False
        if self.ready:
            success = confidence >= self.level
            self.successes += int(success)
            self.block += 1
            if not success and query is not None:
                self.pool[self.pool_size] = query.detach().to(self.pool)
                self.pool_size += 1
            if self.reference:  # the block is tested against a level fixed at its start
                self.pending.append(float(confidence))
            if self.block == self.trials:
                expand = self._test()
        if not self.reference:
            self.recent.append(float(confidence))
            if len(self.recent) == self.window:
                q = sorted(self.recent)[self.rank]
                self.level = q if self.level is None else self.beta * self.level + (1 - self.beta) * q
        elif not self.ready or not self.block:  # filling the reference, or a block just ended
            if not self.ready:
                self.recent.append(float(confidence))
            self.recent.extend(self.pending)
            self.pending = []
            if len(self.recent) == self.reference:
                self.level = sorted(self.recent)[self.rank]
        return expand

    def _test(self) -> bool:
        self.tests += 1
        expand = wilson_lower_bound(self.successes, self.trials, self.z) < self.threshold
        self.new_key = None
        if expand:
            self.expansions += 1
            if self.pool_size:
                self.new_key = nn.functional.normalize(self.pool[: self.pool_size].mean(0), dim=0).clone()
        self.successes = self.block = self.pool_size = 0
        if expand:
            # The memory is about to change (a new slot takes a share of the routing mass), so
            # the old level no longer describes it. Without re-learning it, the confidence drop
            # that a new slot itself causes triggers the next expansion.
            self.relearn_level()
        return expand

    def relearn_level(self) -> None:
        """Forget Q_t and the current block: trials restart once w new confidences are in.
        Called whenever slots are added, by SGSE or otherwise."""
        self.recent.clear()
        self.pending = []
        self.level = None
        self.successes = self.block = self.pool_size = 0

    # ---- saving ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        keys = ("level", "successes", "block", "pool_size", "tests", "expansions")
        return {"recent": list(self.recent), "pending": list(self.pending), **{k: getattr(self, k) for k in keys}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.reset()
        self.recent.extend(state.get("recent", []))
        self.pending = list(state.get("pending", []))
        for key in ("level", "successes", "block", "pool_size", "tests", "expansions"):
            if key in state:
                setattr(self, key, state[key])


# ---- measuring what SGSE claims -------------------------------------------------------------


@dataclass
class ExpansionTiming:
    """How SGSE's expansions sit relative to the stream's task boundaries.

    SGSE claims to add a slot when the input distribution shifts. On a
    class-incremental stream the shifts are the task boundaries, so
    ``near_boundary_fraction`` (expansions within ``window`` steps after a boundary,
    as a share of all expansions) should be far above ``expected_fraction`` (the share
    of steps inside those windows: what expansions at random steps would score), and
    ``away_from_boundary`` counts the expansions that no shift explains.
    """

    expansions: int
    near_boundary: int
    near_boundary_fraction: float | None  # None without expansions
    expected_fraction: float
    lift: float | None  # near_boundary_fraction / expected_fraction
    boundaries_detected: int  # boundaries followed by an expansion within the window
    boundaries: int

    @property
    def away_from_boundary(self) -> int:
        return self.expansions - self.near_boundary


def expansion_timing(
    expansion_steps: list[int], boundary_steps: list[int], total_steps: int, window: int
) -> ExpansionTiming:
    """Measure expansions (the steps they fired in, 1-based) against task boundaries
    (the number of steps done before each new task: its first step is ``b + 1``).
    An expansion at step s is near boundary b when b < s <= b + window."""
    if total_steps <= 0 or window <= 0:
        raise ValueError("expansion_timing needs total_steps > 0 and window > 0")

    def near(step: int, boundary: int) -> bool:
        return boundary < step <= boundary + window

    covered = {s for b in boundary_steps for s in range(b + 1, min(b + window, total_steps) + 1)}
    hits = sum(any(near(s, b) for b in boundary_steps) for s in expansion_steps)
    detected = sum(any(near(s, b) for s in expansion_steps) for b in boundary_steps)
    expected = len(covered) / total_steps
    fraction = hits / len(expansion_steps) if expansion_steps else None
    lift = fraction / expected if fraction is not None and expected > 0 else None
    return ExpansionTiming(len(expansion_steps), hits, fraction, expected, lift, detected, len(boundary_steps))
