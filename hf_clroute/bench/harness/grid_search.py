"""Grid search whose edge picks extend: the search rule of ``hf-clroute tune`` and of the headroom test.

One rule for every search, with nothing chosen search by search:

* **Start, and moves beyond the noise.** The search starts from the grid's centre (:func:`centre`). A
  point becomes the pick only when its validation score beats the current pick's by at least one standard
  error of validation accuracy, ``SE_MULTIPLE * sqrt(p (1 - p) / n_validation)`` with p the pick's score
  (:func:`move_threshold`); a tie or a gain inside the noise keeps the pick (without ``n_validation``, any
  gain above ``TOLERANCE`` moves it). After the grid the best grid point challenges the centre; after that
  each run challenges the pick as it is run.
* **Edges extend, neighbours are checked.** On each axis the pick's neighbours are the nearest values tried
  below and above its own (anywhere in the search); one not run at the pick's other values is run (a
  *check*). Where the pick has no neighbour on a side (the edge of its axis), the axis extends one geometric
  step past it (the ratio of the pick to its other neighbour). Edges run first, then checks, up to
  ``MAX_EXTENSIONS`` runs, the same limit for every search: no search is resumed by hand to go further.
* **Inert axes.** An axis whose values, at the pick's other values, all score the same (within
  ``TOLERANCE``) is inert: it is neither extended nor checked, and the grid runs it wasted (the grid's size
  less its distinct effective configurations) are added to the runs and spent on the other axes: their
  edges and checks, then *refinements* (the geometric midpoint of the pick's widest gap to a neighbour).
  ``effective_budget`` counts the distinct effective configurations evaluated: points that differ only on
  inert axes and score the same count once.

A pick still on an edge of a live axis or with an unrun neighbour there after that, or at the end of its
axis's valid range, is flagged (``"edge": true`` and which axis).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

#: Runs (edges and checks) a search may add past its grid: the largest number any search of the committed
#: tables was ever allowed, so none of them needed more.
MAX_EXTENSIONS = 18
#: A pick moves only on a gain of at least this many standard errors of validation accuracy.
SE_MULTIPLE = 1.0
#: Scores closer than this are the same score (a tie, or an inert axis).
TOLERANCE = 1e-9

Point = dict[str, Any]


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _searched(points: Sequence[Point], axis: str) -> bool:
    return len({repr(p.get(axis)) for p in points}) > 1


def move_threshold(score: float, n_validation: int | None) -> float:
    """The gain a point needs over a pick scoring ``score`` to replace it: ``SE_MULTIPLE`` binomial standard
    errors, ``sqrt(p (1 - p) / n_validation)`` with p = ``score`` clipped to [0, 1]; 0 without ``n_validation``."""
    if not n_validation:
        return 0.0
    p = min(max(float(score), 0.0), 1.0)
    return SE_MULTIPLE * math.sqrt(p * (1 - p) / n_validation)


def centre(grid: Sequence[Point]) -> Point:
    """The grid point nearest the middle of every numeric axis it searches (by rank among the axis's values:
    the middle value, the lower middle of an even count); ties, and non-numeric axes: the first in the grid."""
    values = {axis: sorted({p[axis] for p in grid if _numeric(p.get(axis))})
              for axis in {k for p in grid for k in p} if _searched(grid, axis)}

    def distance(point: Point) -> float:
        return sum(abs(ranks.index(point[axis]) - (len(ranks) - 1) / 2) for axis, ranks in values.items()
                   if _numeric(point.get(axis)) and point[axis] in ranks)
    return min(grid, key=distance)


def needs(tried: list[Point], pick: Point) -> list[tuple[str, str, float, bool]]:
    """What the pick still needs, per numeric axis and side: (axis, "low" | "high", value, is_edge).

    ``is_edge``: no value was tried on that side, and ``value`` is the neighbour on the other side (the
    step past the edge is ``step_past(pick[axis], value)``); otherwise ``value`` is the neighbour on that
    side, not yet run at the pick's other values. Edges come first."""
    edge, check = [], []
    for axis, value in pick.items():
        if not _numeric(value):
            continue
        values = sorted({p[axis] for p in tried if _numeric(p.get(axis))})
        if len(values) < 2:  # not a searched axis
            continue
        i = values.index(value)
        for side, near, far in (("low", values[:i], values[i + 1:]), ("high", values[i + 1:][::-1], values[:i][::-1])):
            if not near:
                edge.append((axis, side, far[0], True))
            elif {**pick, axis: near[-1]} not in tried:
                check.append((axis, side, near[-1], False))
    return edge + check


def step_past(edge: float, neighbour: float) -> float | None:
    """One geometric step past ``edge``, away from ``neighbour`` (the ratio of the two); None where there is
    none: a non-positive value (a geometric step never reaches 0), or an integer axis that would go below 1
    or not move."""
    if edge <= 0 or neighbour <= 0:
        return None
    value = edge * edge / neighbour
    if isinstance(edge, int) and isinstance(neighbour, int):
        value = round(value)
        return value if value >= 1 and value != edge else None
    return float(f"{value:.3g}")


def midpoint(a: float, b: float) -> float | None:
    """The geometric midpoint of two positive values (rounded like :func:`step_past`); None where there is
    none: a non-positive value, or a midpoint that equals either end (an integer axis with no room)."""
    if a <= 0 or b <= 0:
        return None
    value = math.sqrt(a * b)
    value = round(value) if isinstance(a, int) and isinstance(b, int) else float(f"{value:.3g}")
    return None if value in (a, b) else value


def inert_axes(tried: list[Point], scores: list[float], pick: Point, grid: Sequence[Point] | None = None) -> list[str]:
    """The searched axes on which every value tried at the pick's other values scores the same, within
    ``TOLERANCE``; the values must be at least two, and at least as many as the grid gives the axis (so an
    extension that ties the pick before its neighbours ran does not make an axis inert; ``grid`` None: two)."""
    inert = []
    for axis in pick:
        if not _searched(tried, axis):
            continue
        rest = {k: v for k, v in pick.items() if k != axis}
        line = [i for i, p in enumerate(tried) if axis in p and {k: v for k, v in p.items() if k != axis} == rest]
        needed = max(2, len({repr(p.get(axis)) for p in grid or ()}))
        if len({repr(tried[i][axis]) for i in line}) >= needed and \
                max(scores[i] for i in line) - min(scores[i] for i in line) <= TOLERANCE:
            inert.append(axis)
    return inert


def effective_count(points: list[Point], scores: list[float], inert: Sequence[str]) -> int:
    """The distinct effective configurations among ``points``: points that differ only on ``inert`` axes
    and score the same (within ``TOLERANCE``) count once."""
    groups: dict[str, list[float]] = {}
    for point, value in zip(points, scores, strict=True):
        key = json.dumps({k: v for k, v in point.items() if k not in inert}, sort_keys=True, default=repr)
        groups.setdefault(key, []).append(value)
    return sum(1 + sum(b - a > TOLERANCE for a, b in zip(s, s[1:])) for s in map(sorted, groups.values()))


def refinements(tried: list[Point], pick: Point, inert: Sequence[str]) -> list[tuple[str, str, float]]:
    """(axis, side, value): the geometric midpoints between the pick and its neighbour on each side of each
    live numeric axis, the widest gap (in log ratio) first."""
    found = []
    for axis, value in pick.items():
        if axis in inert or not _numeric(value):
            continue
        values = sorted({p[axis] for p in tried if _numeric(p.get(axis))})
        i = values.index(value)
        for side, near in (("low", values[:i][-1:]), ("high", values[i + 1:][:1])):
            if near and (mid := midpoint(value, near[0])) is not None:
                found.append((abs(math.log(near[0] / value)), axis, side, mid))
    return [(axis, side, mid) for _, axis, side, mid in sorted(found, key=lambda f: -f[0])]


def replay(grid: list[Point], tried: list[Point], scores: list[float],
           n_validation: int | None) -> tuple[int, list[dict[str, Any]]]:
    """The pick (its index in ``tried``) and the moves that led to it: from the grid's centre, the best grid
    point (ties: the first) challenges it, then each later run in the order it ran; a challenger replaces the
    pick when it gains more than ``TOLERANCE`` and at least :func:`move_threshold` of the pick's score."""
    pick, moves = tried.index(centre(grid)), []
    challengers = [max(range(len(grid)), key=lambda i: (scores[i], -i)), *range(len(grid), len(tried))]
    for i in challengers:
        gain, threshold = scores[i] - scores[pick], move_threshold(scores[pick], n_validation)
        if gain > TOLERANCE and gain >= threshold - TOLERANCE:
            moves.append({"from": tried[pick], "to": tried[i], "gain": gain, "threshold": threshold})
            pick = i
    return pick, moves


def search(grid: list[Point], score: Callable[[Point], float], valid: Callable[[Point], bool],
           max_extensions: int | None = None, earlier: Sequence[dict[str, Any]] = (),
           n_validation: int | None = None) -> dict[str, Any]:
    """Run ``grid``, then extend edge picks, check their neighbours and spend an inert axis's runs on the
    others (see the module docstring); the record of ``selection.json``.

    ``score`` runs one point (validation A_T); ``valid`` says whether a point is in every field's valid
    range (an extension outside it is not run: that edge is the end of its axis). ``max_extensions``: the
    limit (default ``MAX_EXTENSIONS``, the one every search of the tables runs under). ``n_validation``: the
    validation examples a score is measured on (the move threshold's N). ``earlier``: the extensions an
    earlier search of the same grid recorded (resumed): they stand as tried, with their scores, and count
    towards the limit."""
    limit = MAX_EXTENSIONS if max_extensions is None else max_extensions
    tried = list(grid)
    scores = [score(p) for p in grid]
    extensions = [dict(e) for e in earlier if e["point"] not in tried]
    tried += [e["point"] for e in extensions]
    scores += [e["validation_A_T"] for e in extensions]

    def state() -> tuple[int, list[str], int]:  # the pick, its inert axes, the grid runs they wasted
        pick = replay(grid, tried, scores, n_validation)[0]
        inert = inert_axes(tried, scores, tried[pick], grid)
        return pick, inert, len(grid) - effective_count(grid, scores[:len(grid)], inert)

    def runnable(point: Point) -> bool:
        return point not in tried and valid(point)

    while True:
        pick, inert, freed = state()
        if len(extensions) >= limit + freed:
            break
        pick = tried[pick]
        steps = [(axis, side, {} if is_edge else {"check": True}, point)
                 for axis, side, value, is_edge in needs(tried, pick) if axis not in inert
                 for target in [step_past(pick[axis], value) if is_edge else value]
                 if target is not None and runnable(point := {**pick, axis: target})]
        if not steps and sum(bool(e.get("refine")) for e in extensions) < freed:
            steps = [(axis, side, {"refine": True}, point) for axis, side, value in refinements(tried, pick, inert)
                     if runnable(point := {**pick, axis: value})]
        if not steps:
            break
        axis, side, kind, point = steps[0]
        tried.append(point)
        scores.append(score(point))
        extensions.append({"point": point, "validation_A_T": scores[-1], "axis": axis, "side": side, **kind})
    pick, inert, freed = state()
    _, moves = replay(grid, tried, scores, n_validation)
    rule = {"max_extensions": limit, "runs_freed_by_inert_axes": freed, "start": "the grid's centre",
            "move": "a gain of at least se_multiple standard errors sqrt(p(1-p)/n_validation), p the pick's score",
            "se_multiple": SE_MULTIPLE, "n_validation": n_validation, "tolerance": TOLERANCE}
    return {"grid": grid, "validation_A_T": scores[:len(grid)], "extensions": extensions,
            "pick_point": tried[pick], "pick_validation_A_T": scores[pick], "start_point": centre(grid),
            "moves": moves, "move_threshold": move_threshold(scores[pick], n_validation), "inert_axes": inert,
            "effective_budget": effective_count(tried, scores, inert), "search_rule": rule,
            **flags(tried, tried[pick], valid, len(extensions) >= limit + freed, inert)}


def flags(tried: list[Point], pick: Point, valid: Callable[[Point], bool] | None = None,
          used_up: bool = True, inert: Sequence[str] = ()) -> dict[str, Any]:
    """``edge`` and ``edge_axes`` of a search that tried ``tried`` and picked ``pick``: every side of a live
    axis (not in ``inert``) the pick is still on the edge of, or whose neighbour did not run at the pick's
    other values. ``valid`` (None: every point) tells the end of an axis's valid range from a search that
    stopped (``used_up``)."""
    left = []
    for axis, side, value, is_edge in needs(tried, pick):
        if axis in inert:
            continue
        target = step_past(pick[axis], value) if is_edge else value
        runnable = target is not None and (valid is None or valid({**pick, axis: target}))
        reason = ("extensions used up" if used_up and runnable else "end of the axis's valid range") if is_edge \
            else ("neighbour not run: extensions used up" if runnable else "neighbour not run: outside the valid range")
        left.append({"axis": axis, "side": side, "reason": reason})
    return {"edge": bool(left), "edge_axes": left}


def recorded_flags(record: dict[str, Any]) -> dict[str, Any]:
    """:func:`flags` read back from a ``selection.json`` record (its grid, extensions, pick and inert axes),
    so a search recorded under an earlier rule is judged by this one."""
    tried = list(record["grid"]) + [e["point"] for e in record.get("extensions", [])]
    return flags(tried, record["pick_point"], None, True, record.get("inert_axes", ()))
