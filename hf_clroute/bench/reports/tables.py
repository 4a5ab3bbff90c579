"""The cross-suite tables of the committed results: each method against its control and the best statistics
head, first-session adaptation, headroom, the A_T summary and the variant studies, with the marks († edge
pick, ‡ mixed precisions, "3 of 5 seeds") that every table and results.md shares.

`hf-clroute report` writes them to ``results/summary.md`` and ``results/studies.md``
(:mod:`hf_clroute.bench.reports.report`).
"""

from __future__ import annotations

import re

from hf_clroute.bench.harness.grid_search import recorded_flags
from hf_clroute.bench.harness.results import precision_groups
from hf_clroute.bench.harness.settings import registered_method
from hf_clroute.bench.harness.verdicts import (
    PAIRED_NOTE,
    best_on_validation,
    comparisons,
    is_gain,
    paired_cell,
)
from hf_clroute.bench.studies.headroom import (
    READOUTS,
    mean_of,
    paired_gain,
    readout_edge_mark,
    strongest_readout,
)
from hf_clroute.metrics.aggregate import binomial_se, format_mean_std

#: the upper bound of a suite's table: joint training (cumulative, else offline), else joint training of a head
#: on the frozen backbone
UPPER_BOUNDS = ("joint", "joint-offline", "joint-frozen")


def seed_count(row: dict | None) -> int | None:
    """How many seeds a results row aggregates (None for rows written before per-seed rows were kept)."""
    return len((row or {}).get("per_seed") or []) or None


def a_t_cell(row: dict | None) -> str:
    """A row's A_T cell: mean ± std in %, "(one seed)" for a single seed."""
    return format_mean_std((row or {}).get("A_T"), n=seed_count(row))


def _natural(name: str) -> list:
    """Sort key that orders the numbers inside a name by value."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def study_tables(suites: dict[str, dict]) -> str:
    """A suite named ``<base>-<variant>`` (a suite file extending ``<base>``, e.g. at 20% of the data
    or with another task count) is set beside its base: A_T of the methods run on all of them and
    the change from the base (points). ``suites``: {classification suite: its methods' rows}."""
    out = []
    for base, base_rows in suites.items():
        # A study that shares no method with its base (its own variants, e.g. buffer sizes) has its own section.
        variants = sorted((n for n in suites if n.startswith(base + "-") and set(suites[n]) & set(base_rows)),
                          key=_natural)  # wordnet-5tasks before wordnet-10tasks
        if not variants:
            continue
        methods = [m for m in base_rows if all(m in suites[v] for v in variants)]
        header = "| method | " + base + " | " + " | ".join(f"{v} | change" for v in variants) + " |"
        lines = [f"### {base} and its variants: A_T (%) and change from {base} (points)\n", header,
                 "|---|---|" + "---|---|" * len(variants)]
        seeds = {name: table_seeds(suites[name]) for name in [base, *variants]}
        def cell(name: str, method: str) -> str:
            row = suites[name][method]
            return a_t_cell(row) + precision_mark(row) + seeds_mark(row, seeds[name])

        for method in methods:
            cells = [cell(base, method)]
            for v in variants:
                delta = (suites[v][method]["A_T"]["mean"] - base_rows[method]["A_T"]["mean"]) * 100
                cells += [cell(v, method), f"{delta:+.1f}"]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        note = precision_note([suites[name][m] for name in [base, *variants] for m in methods])
        out.append("\n".join(lines) + "\n" + (f"\n{note}\n" if note else ""))
    return ("## Studies\n\n" + "\n".join(out) + "\n") if out else ""


def summary_table(every: dict[str, dict]) -> str:
    """A_T (mean ± std, %) of every method on every classification suite, side by side
    (variants of a suite go to :func:`study_tables`)."""
    suites = {name: rows for name, rows in every.items() if not any(name.startswith(other + "-") for other in every)}
    if not suites:
        return ""
    methods = sorted({m for rows in suites.values() for m in rows})
    lines = [
        "## Summary: final average accuracy A_T (%) on the classification suites\n",
        "† : " + EDGE_NOTE + "\n",
        "| method | " + " | ".join(suites) + " |",
        "|---|" + "---|" * len(suites),
    ]
    seeds = {name: table_seeds(rows) for name, rows in suites.items()}
    for method in methods:
        cells = [a_t_cell(rows.get(method)) + marks(rows.get(method))
                 + (seeds_mark(rows[method], seeds[name]) if method in rows else "") for name, rows in suites.items()]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    note = precision_note([row for rows in suites.values() for row in rows.values()])
    return "\n".join(lines) + ("\n\n" + note if note else "") + "\n\n"


def edge_mark(row: dict | None) -> str:
    """"†" for a pick still on the edge of its grid after extension, or not yet compared with a neighbour on
    one of its axes. A row that recorded its search (grid, extensions, pick) is judged by today's rule
    (:func:`~hf_clroute.bench.harness.grid_search.recorded_flags`); an older row by the flag it recorded."""
    selection = (row or {}).get("selection") or {}
    if "grid" in selection and "pick_point" in selection:
        return "†" if recorded_flags(selection)["edge"] else ""
    return "†" if selection.get("edge") else ""


def marks(row: dict | None) -> str:
    """The marks a row carries wherever it is named: † (an edge pick), § (searched under the earlier rule)
    and ‡ (mixed precisions)."""
    return edge_mark(row) + earlier_rule_mark(row) + precision_mark(row)


def earlier_rule_mark(row: dict | None) -> str:
    """"§" for a row whose pick came from a search that recorded no ``search_rule``: one made before
    `hf-clroute tune` applied its one rule (a limit of 3 extensions, some resumed by hand, any gain moving the
    pick). A row with nothing searched carries none."""
    selection = (row or {}).get("selection") or {}
    return "§" if "grid" in selection and "search_rule" not in selection else ""


def precision_mark(row: dict | None) -> str:
    """"‡" for a row whose seeds ran at different precisions
    (:func:`~hf_clroute.bench.harness.results.precision_groups`)."""
    return "‡" if len(precision_groups(row or {})) > 1 else ""


def precision_note(rows: list[dict | None]) -> str:
    """:data:`PRECISION_NOTE` where one of ``rows`` carries the mark, else nothing."""
    return PRECISION_NOTE if any(precision_mark(r) for r in rows) else ""


def table_seeds(rows: dict[str, dict]) -> int:
    """How many seeds a suite's table has: those of its fullest row (a row with fewer says so)."""
    return max(len(r.get("per_seed") or []) for r in rows.values())


def seeds_mark(row: dict | None, table_seeds: int) -> str:
    """`` (3 of 5 seeds)`` for a row that ran on fewer of its table's seeds (a row that did not fit the
    compute); empty for a full row, and for rows written before per-seed rows were kept."""
    ran = seed_count(row) or table_seeds
    return f" ({ran} of {table_seeds} seeds)" if ran < table_seeds else ""


def se_cell(row: dict | None, test_size: int | None) -> str:
    """Test-sampling SE of A_T in points, sqrt(p (1 - p) / N_test); "n/a" where N_test was not recorded."""
    stat = (row or {}).get("A_T")
    if not stat or not test_size:
        return "n/a"
    return f"{binomial_se(stat['mean'], test_size) * 100:.1f}"


EDGE_NOTE = ("the pick is still on the edge of its search grid after extension, or a neighbour of it on one axis "
             "never ran at its other values (selection.json; `hf_clroute/bench/harness/grid_search.py`). § : the "
             "pick comes from a search made before `hf-clroute tune` applied its one rule (docs/protocol.md), not "
             "yet searched again.")
PRECISION_NOTE = ("‡ : its seeds ran at different precisions (each seed's `precision` in results.json: bf16 on a CPU "
                  "with bf16 units, fp32 on one without); the paired fp32-vs-bf16 check (BENCHMARKS.md, "
                  "Mixed precision) found A_T within the paired noise on the suites it ran.")
SE_NOTE = ("SE: the test-sampling standard error of A_T, sqrt(p (1 - p) / N_test) with N_test the suite's fixed "
           "test set (binomial; it leaves out the seed-to-seed spread that the std shows). † : " + EDGE_NOTE)


def upper_bound_cell(rows: dict[str, dict]) -> str:
    """Joint training (else joint-frozen) with its A_T and the epochs per task it trained (chosen on validation)."""
    bound = next((m for m in UPPER_BOUNDS if m in rows), None)
    if not bound:
        return "—"
    epochs = ((rows[bound].get("settings") or {}).get("training") or {}).get("epochs")
    return f"{bound}{edge_mark(rows[bound])} {a_t_cell(rows[bound])}" + (f" ({epochs} ep.)" if epochs else "")


def controls_table(every: dict[str, dict], test_sizes: dict[str, int | None] | None = None) -> str:
    """Each method beside its control (the same head and loss without the method's own part, named by
    ``"control"`` in its settings file) and beside the best class-statistics head, per suite: paired verdicts."""
    suites = {name: rows for name, rows in every.items() if not any(name.startswith(other + "-") for other in every)}
    lines, marked = [], []  # marked: the rows named with their marks (the ‡ note goes where one carries it)
    for suite, rows in suites.items():
        compared = comparisons(rows)
        shown = [m for m, c in compared.items() if c["control"]]
        if not shown:
            continue
        n_test = (test_sizes or {}).get(suite)
        lines += [f"### {suite}\n",
                  "| method | A_T | SE | control | control A_T | method − control | best statistics head | its A_T | "
                  "method − head | upper bound |", "|---|---|---|---|---|---|---|---|---|---|"]
        for method in shown:
            c = compared[method]
            head = c["statistics_head"]
            marked += [rows[method], rows[c["control"]]]
            lines.append(
                f"| {method}{marks(rows[method])} | {a_t_cell(rows[method])} | {se_cell(rows[method], n_test)} | "
                f"{c['control']}{marks(rows[c['control']])} | {a_t_cell(rows[c['control']])} | "
                f"{paired_cell(c['vs_control'])} | {head or '—'} | {a_t_cell(rows.get(head))} | "
                f"{paired_cell(c['vs_statistics_head']) if head else '—'} | {upper_bound_cell(rows)} |")
        lines.append("")
    if not lines:
        return ""
    intro = ("## Methods against their controls and the strongest simple baseline\n\n"
             "A_T (%), mean ± std over seeds. " + PAIRED_NOTE + " " + SE_NOTE + " The upper bound is joint "
             "training of the whole model (`joint`: at every task on the tasks so far; `joint-offline`: once, at "
             "the last task, on every task), or, where neither was run, joint training of a head on the frozen "
             "backbone (`joint-frozen`), each at the epochs chosen on validation (ep.).\n\n")
    note = precision_note(marked)
    return intro + "\n".join(lines) + "\n" + (note + "\n\n" if note else "")


def adapted(row: dict) -> bool:
    """Whether a row's adapter was adapted before its stream (first-session adaptation)."""
    return bool((((row.get("settings") or {}).get("adapter_config")) or {}).get("adaptation"))


def module_name(method: str, row: dict) -> str:
    """What an adapted row adapts: its registered method, or the backbone's last blocks."""
    blocks = row["settings"]["adapter_config"].get("last_blocks")
    return f"last {blocks} block{'s' if blocks > 1 else ''}" if blocks else registered_method(method)


def adaptation_rows(every: dict[str, dict]) -> tuple[list[str], list[tuple]]:
    """The adaptation table's rows, and per table (suite, best adapted row by validation A_T, its paired
    difference from the best statistics head)."""
    lines, best_rows = [], []
    for suite, rows in every.items():
        shown = [m for m in rows if adapted(rows[m]) and rows[m].get("A_T")]
        if not shown:
            continue
        compared = comparisons(rows)
        for method in shown:
            c, head = compared[method], rows[method]["settings"]["adapter_config"].get("head")
            lines.append(f"| {suite} | {module_name(method, rows[method])} | {head} | "
                         f"{method}{edge_mark(rows[method])} | {a_t_cell(rows[method])} | "
                         f"{paired_cell(c['vs_control'])} | {c['statistics_head'] or '—'} | "
                         f"{paired_cell(c['vs_statistics_head'])} |")
        best = best_on_validation(rows, shown)
        best_rows.append((suite, best, compared[best]["vs_statistics_head"] if best else None))
    return lines, best_rows


def adaptation_finding(every: dict[str, dict]) -> str:
    """On how many tables the best adapted row (chosen by validation A_T) beats the best frozen statistics
    head by the paired test, naming each table's pick; '' where no row was adapted."""
    _, best_rows = adaptation_rows(every)
    if not best_rows:
        return ""
    wins = [s for s, _, paired in best_rows if is_gain(paired)]
    chosen = [f"{s}: {m} {paired_cell(p)}" if m else f"{s}: n/a (an adapted row has no validation score)"
              for s, m, p in best_rows]
    return (f"The best adapted row (by validation A_T) is better than the best frozen statistics head by the "
            f"paired test on {len(wins)} of {len(best_rows)} tables (" + "; ".join(chosen) + ").")


def adaptation_table(every: dict[str, dict]) -> str:
    """First-session adaptation, module x head: each adapted row against the same head on the frozen
    backbone (its control) and against the table's best statistics head, and :func:`adaptation_finding`."""
    lines, _ = adaptation_rows(every)
    if not lines:
        return ""
    return ("## First-session adaptation: module x head\n\n"
            "The module is adapted on the first task, frozen, then the head accumulates the stream on its features "
            "in eval mode; each row against the same head on the frozen backbone (its control) and against the "
            "table's best statistics head. " + PAIRED_NOTE + "\n\n" + adaptation_finding(every) + "\n\n"
            "| table | module | head | row | A_T | − same head, frozen | best statistics head | − best head |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n")


def headroom_findings(studies: dict[str, dict]) -> str:
    """Per study, its readout strongest on the frozen features by validation (the bar a continual protocol
    would have to clear) and the adapters whose gain on it the paired test calls better; '' without studies."""
    findings = []
    for name, study in studies.items():
        methods = study.get("methods") or {}
        if not methods:
            continue
        strongest = strongest_readout(study)
        if strongest is None:
            findings.append(f"{name}: n/a (a frozen readout has no validation score, so none is the strongest)")
            continue
        gains = {a: paired_gain(m["per_seed"], strongest) for a, m in methods.items()}
        gaining = [a for a in methods if is_gain(gains[a])]
        findings.append(f"{name}: {strongest} ({mean_of(study, strongest) * 100:.1f} frozen), "
                        + (", ".join(f"{a} {paired_cell(gains[a])}" for a in gaining) or "none"))
    return "; ".join(findings)


def headroom_table(studies: dict[str, dict]) -> str:
    """The headroom studies side by side: each adapter's paired gain (adapted − frozen features) per
    readout, and :func:`headroom_findings`."""
    lines, columns = [], list(READOUTS)
    for name, study in studies.items():
        methods = study.get("methods") or {}
        if not methods:
            continue
        strongest = strongest_readout(study)
        gains = {a: {r: paired_gain(m["per_seed"], r) for r in READOUTS} for a, m in methods.items()}
        for adapter, m in methods.items():
            cells = [f"{paired_cell(gains[adapter][r])}{readout_edge_mark(study, adapter, r)}"
                     f"{' *' if r == strongest else ''}" for r in columns]
            # the adapter's own seeds: a merged study may hold more seeds of another adapter
            lines.append(f"| {name} | {len(m['per_seed'])} | {adapter} | " + " | ".join(cells) + " |")
        for adapter in [a for a in (study.get("config") or {}).get("adapters", []) if a not in methods]:
            # an adapter the study lists but its committed results lack: a visible row, never a silent gap
            lines.append(f"| {name} | 0 | {adapter} | " + " | ".join(["not run"] * len(columns)) + " |")
    if not lines:
        return ""
    header = "| study | seeds | adapter | " + " | ".join(f"gain: {r}" for r in columns) + " |"
    return ("## Headroom: what an adapter trained on every class at once gains over frozen features\n\n"
            "Points, adapted − frozen, paired by seed. " + PAIRED_NOTE + " * marks the readout strongest on the "
            "frozen features by its validation accuracy; † : a readout's pick (its lambda, shrinkage or L2) is still "
            "on the edge of its grid after extension on some seed. Adapters whose gain on that readout the paired "
            "test calls better — " + headroom_findings(studies) + ".\n\n"
            + header + "\n|---|---|---|" + "---|" * len(columns) + "\n" + "\n".join(lines) + "\n\n")
