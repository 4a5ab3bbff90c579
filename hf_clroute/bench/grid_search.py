"""Grid search whose edge picks extend: the search rule of ``hf-clroute tune`` and of the headroom test.

A numeric pick on the edge of its axis extends that axis one geometric step past the edge (the ratio
of the edge to its neighbour; the other axes at the pick) and runs it, up to ``MAX_EXTENSIONS`` runs.
A pick still on an edge after that, or at the end of its axis's valid range, is flagged
(``"edge": true`` and which axis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_EXTENSIONS = 3

Point = dict[str, Any]


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def edges(tried: list[Point], pick: Point) -> list[tuple[str, str, float]]:
    """(axis, "low" | "high", the neighbouring value) for every numeric axis the pick is on the edge of.

    The axis is the line through the pick (the other axes at the pick's values); where that line
    holds the pick alone (explicit points), every value tried on the axis."""
    out = []
    for axis, value in pick.items():
        if not _numeric(value):
            continue
        on_axis = [p for p in tried if _numeric(p.get(axis))]
        line = sorted({p[axis] for p in on_axis if all(p.get(k) == v for k, v in pick.items() if k != axis)})
        line = line if len(line) > 1 else sorted({p[axis] for p in on_axis})
        if len(line) > 1 and value in (line[0], line[-1]):
            out.append((axis, "low", line[1]) if value == line[0] else (axis, "high", line[-2]))
    return out


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
           max_extensions: int | None = None) -> dict[str, Any]:
    """Run ``grid``, then extend edge picks (see the module docstring); the record of ``selection.json``.

    ``score`` runs one point (validation A_T); ``valid`` says whether a point is in every field's valid
    range (an extension outside it is not run: that edge is the end of its axis)."""
    limit = MAX_EXTENSIONS if max_extensions is None else max_extensions
    tried = list(grid)
    scores = [score(p) for p in grid]
    extensions: list[dict[str, Any]] = []

    def best() -> Point:  # ties: the first run, so an extension that only ties never moves the pick
        return tried[max(range(len(tried)), key=lambda i: (scores[i], -i))]

    def next_point(pick: Point, axis: str, neighbour: float) -> Point | None:
        value = step_past(pick[axis], neighbour)
        point = None if value is None else {**pick, axis: value}
        return point if point is not None and point not in tried and valid(point) else None

    while len(extensions) < limit:
        pick = best()
        steps = [(axis, side, p) for axis, side, n in edges(tried, pick) if (p := next_point(pick, axis, n))]
        if not steps:
            break
        axis, side, point = steps[0]
        tried.append(point)
        scores.append(score(point))
        extensions.append({"point": point, "validation_A_T": scores[-1], "axis": axis, "side": side})
    pick = best()
    left = [{"axis": axis, "side": side,
             "reason": "extensions used up" if len(extensions) >= limit and next_point(pick, axis, n)
             else "end of the axis's valid range"}
            for axis, side, n in edges(tried, pick)]
    return {"grid": grid, "validation_A_T": scores[:len(grid)], "extensions": extensions, "pick_point": pick,
            "pick_validation_A_T": scores[tried.index(pick)], "edge": bool(left), "edge_axes": left}
