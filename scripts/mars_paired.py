"""MaRS's ablation table from a bench run: per-seed paired differences against the paper's targets.

    python scripts/mars_paired.py results/mars-split-mnist            # -> paired.json, paired.md

Targets (MaRS paper, 10-task CIFAR-100 with frozen CLIP): full MaRS at least 1.5x naive fine-tuning's
A_T (57.50 vs 30.26, 1.9x) and above each ablation (no SGSE ~41, no anchors ~42) by a significant
paired margin. Reads parts/*/results.json (bench runs of one row or of several; the seeds of a suite
draw the same streams in every run), selection.json (the validation study of the mars row's options)
and tune/*/selection.json (each row's pick); writes paired.json and paired.md in OUT.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from hf_clroute.methods.mars.sgse import expansion_timing
from hf_clroute.metrics.aggregate import paired_difference

FULL = "mars"
ABLATIONS = ("mars-no-sgse", "mars-no-anchor", "mars-no-stage1", "mars-no-stage2", "mars-head-only", "mars-ctl",
             "mars-paper")
BASELINE = "finetune"
TARGET_RATIO = 1.5


def per_seed(row: dict, seeds: list[int], key: str = "A_T") -> dict[int, float]:
    return {int(run.get("seed", seed)): float(run[key]) for run, seed in zip(row["per_seed"], seeds)}


def mean_std(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n}


def sgse_timing(row: dict, window: int = 10) -> list[dict]:
    """SGSE's expansions against the task boundaries, per seed that recorded its curves."""
    out = []
    for run in row["per_seed"]:
        curves = run.get("curves") or {}
        if "expansion_history" not in curves:
            continue
        starts = [step for step, _ in curves["task_start_history"]]
        total = int(run.get("steps") or (starts[-1] + (starts[-1] - starts[-2] if len(starts) > 1 else 1)))
        timing = expansion_timing([s for s, _ in curves["expansion_history"]], starts[1:], total, window)
        out.append({"seed": run.get("seed"), "expansions": timing.expansions,
                    "boundaries_detected": timing.boundaries_detected, "boundaries": timing.boundaries,
                    "away_from_boundary": timing.away_from_boundary})
    return out


def _in_order(files) -> list[Path]:
    """A run in DIR-extended (`mars_ablations.sh extend`: a search continued past the extension limit, and its
    seeds re-run) comes after every other, so its rows and picks replace theirs."""
    return sorted(files, key=lambda f: (f.parent.name.endswith("-extended"), f.parent.name))


def table(out: Path) -> dict:
    runs = [json.loads(f.read_text()) for f in _in_order((out / "parts").glob("*/results.json"))]
    if len({r["suite"] for r in runs}) != 1:
        raise SystemExit(f"{out}/parts holds runs of several suites: {sorted({r['suite'] for r in runs})}")
    methods = {m: row for r in runs for m, row in r["methods"].items()}
    a_t = {m: per_seed(row, r["seeds"]) for r in runs for m, row in r["methods"].items()}
    rows = {m: {**mean_std(list(v.values())), "per_seed": v} for m, v in a_t.items()}
    seeds = sorted({s for v in a_t.values() for s in v})
    report: dict = {"suite": runs[0]["suite"], "seeds": seeds, "A_T": rows, "targets": {
        "ratio_to_finetune": TARGET_RATIO, "above_each_ablation": "paired t, p < 0.05"}}
    if FULL in a_t:
        report["full_vs_ablation"] = {m: paired_difference(a_t[FULL], a_t[m]) for m in ABLATIONS if m in a_t}
        report["sgse_timing"] = sgse_timing(methods[FULL])
    if FULL in a_t and BASELINE in a_t:
        common = sorted(set(a_t[FULL]) & set(a_t[BASELINE]))
        ratios = {s: a_t[FULL][s] / a_t[BASELINE][s] for s in common}
        scaled = {s: TARGET_RATIO * a_t[BASELINE][s] for s in common}
        report["ratio_to_finetune"] = {**mean_std(list(ratios.values())), "per_seed": ratios,
                                       # full - 1.5 x finetune, seed by seed: "better" = the target is met
                                       "vs_target": paired_difference(a_t[FULL], scaled)}
    def picks(path: Path, only: str | None = None) -> dict:
        chosen = json.loads(path.read_text())["methods"]
        return {m: {"validation_A_T": p.get("pick_validation_A_T"), "pick": p.get("pick"), "edge": p.get("edge", False)}
                for m, p in sorted(chosen.items()) if only in (None, m)}

    if (out / "selection.json").is_file():
        report["validation"] = picks(out / "selection.json")
        report["validation_note"] = (
            "The validation study ran while the mars row used SGSE on the nearest-key similarity against a "
            "calibrated 200-input reference: its entry 'mars' is that base (now mars-val-calibrated-sgse), each "
            "mars-val-* row the base with one option set otherwise. mars-val-tracked-sgse scored highest, so the "
            "mars row now uses the tracked level; its own pick is row_picks['mars'].")
    # tune/<row>/ holds one row's pick; tune/ablations/ (`mars_ablations.sh together`) and tune/*-extended/ hold several
    several = lambda name: name == "ablations" or name.endswith("-extended")
    report["row_picks"] = {k: v for f in _in_order((out / "tune").glob("*/selection.json"))
                           for k, v in picks(f, None if several(f.parent.name) else f.parent.name).items()}
    return report


def markdown(report: dict) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    lines = [f"# MaRS ablations on {report['suite']} (seeds {report['seeds']})", "",
             "| row | A_T | full - row (paired) | wins | p | verdict |", "|---|---|---|---|---|---|"]
    for m, row in report["A_T"].items():
        d = report.get("full_vs_ablation", {}).get(m)
        cells = (f"{pct(d['mean'])} ± {pct(d['std'])}", f"{d['wins']}/{d['n']}",
                 f"{d['p']:.3g}" if d["p"] is not None else "—", d["verdict"]) if d else ("", "", "", "")
        lines.append(f"| {m} | {pct(row['mean'])} ± {pct(row['std'])} | " + " | ".join(cells) + " |")
    ratio = report.get("ratio_to_finetune")
    if ratio:
        v = ratio["vs_target"]
        lines += ["", f"full / fine-tune: {ratio['mean']:.2f} ± {ratio['std']:.2f} (target >= {TARGET_RATIO}); "
                      f"full - {TARGET_RATIO} x fine-tune: {pct(v['mean'])} ± {pct(v['std'])}, {v['verdict']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    report = table(args.out)
    (args.out / "paired.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (args.out / "paired.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
