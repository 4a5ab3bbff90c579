"""The one way a runner writes its results: ``results.json`` (with its ``kind``) and ``results.md``.

Every per-seed row records the pick it ran with (``"selection"``: the hyper-parameters and where they were
chosen); a table whose seeds of one method ran with different picks is refused before anything is written,
so a merge never joins them silently. Seeds that ran at different precisions (bf16 on a CPU with bf16 units,
fp32 on one without) are joined, but visibly: :func:`precision_groups` names them, the merge prints them and the
tables mark the row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import atomic_write_text


def pick_record(selection: dict[str, Any] | None) -> dict[str, Any]:
    """What a classification row ran with, for its per-seed ``"selection"``: ``hf-clroute tune``'s pick for
    the method (``selection.json``'s entry) and where it was chosen, or the settings files' values."""
    if not selection:
        return {"pick": None, "chosen_on": "none: the settings files' values (no selection.json)"}
    return {"pick": selection.get("pick"), "chosen_on": f"hf-clroute tune, the validation split of seed "
                                                        f"{selection.get('seed', 0)}",
            "validation_A_T": selection.get("pick_validation_A_T"), "edge": selection.get("edge")}


def seeds_by(row: dict[str, Any], key: Callable[[dict[str, Any]], str]) -> dict[str, list[int]]:
    """A results row's seeds grouped by what ``key`` reads from each seed's row, in the order first seen."""
    groups: dict[str, list[int]] = {}
    for seed_row in row.get("per_seed") or []:
        groups.setdefault(key(seed_row), []).append(seed_row.get("seed"))
    return groups


def check_picks(results: dict[str, Any]) -> None:
    """Refuse a table where one method's seeds ran with different picks (their per-seed ``"selection"``),
    or where only some of its seeds recorded theirs; rows written before picks were recorded pass."""
    for method, row in (results.get("methods") or {}).items():
        groups = seeds_by(row, lambda seed_row: json.dumps(seed_row.get("selection"), sort_keys=True))
        if len(groups) > 1:
            found = "; ".join(f"seeds {ids}: {json.loads(key) if key != 'null' else 'not recorded'}"
                              for key, ids in groups.items())
            raise UserInputError(f"method {method!r} of {results.get('suite')!r}: its seeds ran with different "
                                 f"picks ({found}); re-run them with one selection, or keep them in separate "
                                 "tables (another --out, or merge with --drop)")


def seed_precision(seed_row: dict[str, Any]) -> str:
    """The dtype one seed's row ran with: ``"fp32"`` or ``"bf16"``, or per phase (``"eval bf16, train fp32"``)
    where its phases differ. A row that recorded none ran before the precision setting existed, in fp32."""
    phases = {phase: (record or {}).get("dtype", "fp32") for phase, record in (seed_row.get("precision") or {}).items()}
    if len(set(phases.values())) > 1:
        return ", ".join(f"{phase} {dtype}" for phase, dtype in sorted(phases.items()))
    return next(iter(phases.values()), "fp32")


def precision_groups(row: dict[str, Any]) -> dict[str, list[int]]:
    """A results row's seeds by the precision they ran with, e.g. ``{"bf16": [0, 1, 2], "fp32": [3, 4]}``."""
    return seeds_by(row, seed_precision)


def mixed_precisions(results: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """The methods of a table whose seeds ran at different precisions, each with its groups of seeds."""
    return {method: groups for method, row in (results.get("methods") or {}).items()
            if len(groups := precision_groups(row)) > 1}


def write_run(out: Path, results: dict[str, Any], markdown: str) -> dict[str, Any]:
    """Write ``out/results.json`` and ``out/results.md`` atomically; ``results['kind']`` names the runner."""
    if results.get("kind") not in ("classification", "charlm", "plasticity", "headroom"):
        raise ValueError(f"results must say which runner wrote them ('kind'), got {results.get('kind')!r}")
    check_picks(results)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "results.md", markdown)
    return results


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"
