"""Grid search whose edge picks extend: the search rule of ``hf-clroute tune`` and of the headroom test.

A pick is a pick when, on every numeric axis, it beats its neighbours with the other axes at the
pick's values. On each axis the neighbours are the nearest values tried below and above the pick's
(anywhere in the search); one that was not run at the pick's other values is run (a *check*: an
extension moved the pick off the grid's lines, or the grid is explicit points). Where the pick has
no neighbour on a side (the edge of its axis), the axis extends one geometric step past it (the ratio
of the pick to its neighbour on the other side). Extensions run first, then checks, up to
``MAX_EXTENSIONS`` runs in all. A pick still on an edge or with an unrun neighbour after that, or at
the end of its axis's valid range, is flagged (``"edge": true`` and which axis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_EXTENSIONS = 3

Point = dict[str, Any]


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def search(grid: list[Point], score: Callable[[Point], float], valid: Callable[[Point], bool],
           max_extensions: int | None = None, earlier: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Run ``grid``, then extend edge picks and check their neighbours (see the module docstring); the
    record of ``selection.json``.

    ``score`` runs one point (validation A_T); ``valid`` says whether a point is in every field's valid
    range (an extension outside it is not run: that edge is the end of its axis). ``earlier``: the extensions
    an earlier search of the same grid recorded (resumed): they stand as tried, with their scores, and count
    towards ``max_extensions``, so the search goes on from the best point found so far."""
    limit = MAX_EXTENSIONS if max_extensions is None else max_extensions
    tried = list(grid)
    scores = [score(p) for p in grid]
    extensions = [dict(e) for e in earlier if e["point"] not in tried]
    tried += [e["point"] for e in extensions]
    scores += [e["validation_A_T"] for e in extensions]

    def best() -> Point:  # ties: the first run, so an extension that only ties never moves the pick
        return tried[max(range(len(tried)), key=lambda i: (scores[i], -i))]

    def next_point(pick: Point, axis: str, value: float, is_edge: bool) -> Point | None:
        value = step_past(pick[axis], value) if is_edge else value
        point = None if value is None else {**pick, axis: value}
        return point if point is not None and point not in tried and valid(point) else None

    while len(extensions) < limit:
        pick = best()
        steps = [(axis, side, is_edge, p) for axis, side, v, is_edge in needs(tried, pick)
                 if (p := next_point(pick, axis, v, is_edge))]
        if not steps:
            break
        axis, side, is_edge, point = steps[0]
        tried.append(point)
        scores.append(score(point))
        extensions.append({"point": point, "validation_A_T": scores[-1], "axis": axis, "side": side,
                           **({} if is_edge else {"check": True})})
    pick = best()
    return {"grid": grid, "validation_A_T": scores[:len(grid)], "extensions": extensions, "pick_point": pick,
            "pick_validation_A_T": scores[tried.index(pick)], **flags(tried, pick, valid, len(extensions) >= limit)}


def flags(tried: list[Point], pick: Point, valid: Callable[[Point], bool] | None = None,
          used_up: bool = True) -> dict[str, Any]:
    """``edge`` and ``edge_axes`` of a search that tried ``tried`` and picked ``pick``: every side the pick
    is still on the edge of, or whose neighbour did not run at the pick's other values. ``valid`` (None:
    every point) tells the end of an axis's valid range from a search that stopped (``used_up``)."""
    left = []
    for axis, side, value, is_edge in needs(tried, pick):
        target = step_past(pick[axis], value) if is_edge else value
        runnable = target is not None and (valid is None or valid({**pick, axis: target}))
        reason = ("extensions used up" if used_up and runnable else "end of the axis's valid range") if is_edge \
            else ("neighbour not run: extensions used up" if runnable else "neighbour not run: outside the valid range")
        left.append({"axis": axis, "side": side, "reason": reason})
    return {"edge": bool(left), "edge_axes": left}


def recorded_flags(record: dict[str, Any]) -> dict[str, Any]:
    """:func:`flags` read back from a ``selection.json`` record (its grid, extensions and pick), so a search
    recorded under an earlier rule is judged by this one."""
    tried = list(record["grid"]) + [e["point"] for e in record.get("extensions", [])]
    return flags(tried, record["pick_point"], None, True)
