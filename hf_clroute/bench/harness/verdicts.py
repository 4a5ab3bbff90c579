"""Paired verdicts: the one bar for "better", "worse" and "gain" in every table and sentence.

Two rows of a table are compared seed by seed (they share each seed's stream and test set) with
``metrics.paired_difference``: better / worse at p < 0.05 of the paired t test with at least
``MIN_PAIRED_SEEDS`` seeds, tie otherwise, "too few seeds" below that; a one-seed comparison says
"one seed, no test". A comparator (the best statistics head, the best adapted row, the strongest
readout) is chosen on the validation split, never on test; where a row recorded no validation
score it is n/a rather than a choice made on test.
"""

from __future__ import annotations

from collections.abc import Iterable

from hf_clroute.bench.harness.settings import method_file, registered_method
from hf_clroute.metrics.aggregate import MIN_PAIRED_SEEDS, mean_std, paired_difference

#: closed-form class-statistics heads on frozen features: the strongest simple baselines.
STATISTICS_HEADS = ("simplecil", "slda", "ranpac", "ncm")
#: rows whose probe reads the frozen backbone's own features (a statistics head's features are the
#: backbone's): the first of these in a table gives the floor of deep forgetting.
FLOOR_ROWS = ("simplecil", "ncm", "slda")

PAIRED_NOTE = ("Paired differences are taken seed by seed (a method and its partner share each seed's stream and "
               "test set): mean ± std of the difference in points, the number of seeds where the method is "
               f"higher of those both ran, the two-sided p of the paired t test; the verdict is better/worse at "
               f"p < 0.05 with at least {MIN_PAIRED_SEEDS} seeds, tie otherwise, \"too few seeds\" below "
               f"{MIN_PAIRED_SEEDS}, and \"one seed, no test\" for a single seed. Comparators (the best statistics "
               "head, the best adapted row) are chosen by their validation A_T (selection.json), never by test; "
               "n/a where no validation score was recorded.")


def is_statistics_head(method: str) -> bool:
    return method in STATISTICS_HEADS or registered_method(method) in STATISTICS_HEADS


def validation_score(row: dict | None) -> float | None:
    """A row's validation A_T at its pick (``hf-clroute tune``'s ``pick_validation_A_T``), None if not recorded."""
    return ((row or {}).get("selection") or {}).get("pick_validation_A_T")


def best_on_validation(rows: dict[str, dict], candidates: Iterable[str]) -> str | None:
    """The candidate with the best validation score (ties: the first); None where any candidate has none
    (choosing among the rest, or by test, would be a choice the validation split did not make)."""
    candidates = list(candidates)
    scores = {m: validation_score(rows[m]) for m in candidates}
    if not candidates or any(s is None for s in scores.values()):
        return None
    return max(candidates, key=lambda m: (scores[m], -candidates.index(m)))


def best_statistics_head(rows: dict[str, dict]) -> str | None:
    """The class-statistics head (simplecil/ncm, slda, ranpac or a variant) with the best validation A_T."""
    return best_on_validation(rows, [m for m in rows if is_statistics_head(m) and rows[m].get("A_T")])


def per_seed(row: dict, key: str = "A_T") -> dict[int, float]:
    return {r["seed"]: r[key] for r in row.get("per_seed", []) if r.get(key) is not None}


def comparisons(rows: dict[str, dict]) -> dict[str, dict]:
    """Per method: paired per-seed differences of A_T against its control (``"control"`` in its settings
    file) and against the suite's best statistics head (see ``paired_difference``); a missing partner is None."""
    head = best_statistics_head(rows)
    out = {}
    for method, row in rows.items():
        control = method_file(method).get("control")
        control = control if control in rows else None
        against_head = head if head and not is_statistics_head(method) else None
        out[method] = {
            "control": control,
            "vs_control": paired_difference(per_seed(row), per_seed(rows[control])) if control else None,
            "statistics_head": against_head,
            "vs_statistics_head": (paired_difference(per_seed(row), per_seed(rows[against_head]))
                                   if against_head else None),
        }
    return out


def is_gain(paired: dict | None) -> bool:
    """A paired difference the test calls better (p < 0.05, enough seeds): the one bar for a gain."""
    return bool(paired) and paired["verdict"] == "better"


def paired_cell(paired: dict | None) -> str:
    """``+1.2 ± 0.8 (4 of 5, p 0.03): better`` in points; ``+1.2 (one seed, no test)``; "n/a" without shared seeds."""
    if not paired:
        return "n/a"
    if paired["n"] == 1:
        return f"{paired['mean'] * 100:+.1f} (one seed, no test)"
    p = "" if paired["p"] is None else f", p {paired['p']:.2g}"
    return (f"{paired['mean'] * 100:+.1f} ± {paired['std'] * 100:.1f} ({paired['wins']} of {paired['n']}{p}): "
            f"{paired['verdict']}")


def probe_of(row: dict) -> str | None:
    """The probe that measured a row's deep forgetting (its seeds' ``probe``): None for rows written before
    the probe was recorded, "mixed" when its seeds disagree."""
    names = {r.get("probe") for r in row.get("per_seed", []) if r.get("deep_forgetting") is not None}
    return next(iter(names)) if len(names) == 1 else ("mixed" if names else None)


def deep_forgetting_floor(rows: dict[str, dict]) -> dict | None:
    """The frozen backbone's deep forgetting on this table's streams: features that cannot change still
    "forget" as the label space grows. ``{"method", "probe", "per_seed", "mean", "std"}`` from the first of
    :data:`FLOOR_ROWS` that was probed; None when none was."""
    for method in FLOOR_ROWS:
        seeds = per_seed(rows.get(method, {}), "deep_forgetting")
        if seeds:
            return {"method": method, "probe": probe_of(rows[method]), "per_seed": seeds,
                    **mean_std(list(seeds.values()))}
    return None


def above_floor(row: dict, floor: dict | None) -> dict | None:
    """Paired per-seed difference of a row's deep forgetting and the floor (see ``paired_difference``);
    None where the row's deep forgetting was measured by another probe than the floor's."""
    seeds = per_seed(row, "deep_forgetting")
    if not floor or not seeds or probe_of(row) != floor.get("probe") or "mixed" == probe_of(row):
        return None
    return paired_difference(seeds, floor["per_seed"])
