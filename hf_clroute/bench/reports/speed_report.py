"""Markdown tables of the precision, roofline and thread measurements in results/speed.

``python -m hf_clroute.bench.reports.speed_report`` reads ``roofline.json``, ``precision_check.json`` and
``threads.json`` (those present) and writes the tables into ``results/speed/README.md`` between the
markers below, leaving the rest of the page as it is; ``--print`` prints them instead (the section
BENCHMARKS.md takes).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

START, END = "<!-- precision-roofline: start -->", "<!-- precision-roofline: end -->"


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _load_avg(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}" if values else "—"


def roofline_section(r: dict[str, Any]) -> list[str]:
    peaks = r["matmul_peak_gflops"]
    load = [r["load_average"]["start"][0], r["load_average"]["end"][0]]
    lines = [f"### Roofline (`{r['command']}`, {r['date']}, {r['machine']['threads']} thread, load average "
             f"{_load_avg(load)})", "",
             f"Matmul peak ({r['settings']['matmul_size']}^2, best of {r['settings'].get('matmul_repeats', 5)}): "
             f"fp32 {peaks['fp32']:.0f}, bf16 {peaks['bf16']:.0f}, fp64 {peaks['fp64']:.0f} GFLOP/s. "
             f"CPU bf16: {r['machine']['bf16_hardware'][1]}.",
             "", "| workload | batch | GFLOP per call | fp32 GFLOP/s (% of peak) | bf16 GFLOP/s (% of peak) | "
                 "samples/s fp32 → bf16 | bf16 / fp32 |", "|---|---|---|---|---|---|---|"]
    for w in r["workloads"]:
        g, frac, s = w["gflops"], w["fraction_of_peak"], w["samples_per_s"]
        if "bf16" in g:
            lines.append(f"| {w['workload']} | {w['batch']} | {w['flops'] / 1e9:.2f} | {g['fp32']:.1f} "
                         f"({100 * frac['fp32']:.0f}%) | {g['bf16']:.1f} ({100 * frac['bf16']:.0f}%) | "
                         f"{s['fp32']:.0f} → {s['bf16']:.0f} | {w['bf16_speedup']:.2f}x |")
        else:
            lines.append(f"| {w['workload']} (fp64) | {w['batch']} | {w['flops'] / 1e9:.3f} | "
                         f"fp64 {g['fp64']:.1f} ({100 * frac['fp64']:.0f}% of fp64) | | {s['fp64']:.0f} | |")
    return lines + [""]


def targets(r: dict[str, Any]) -> list[str]:
    rows = {(w["workload"], w["batch"]): w for w in r["workloads"]}
    out = []
    train = rows.get(("minilm train", 10))
    if train:
        ratio = train["bf16_speedup"]
        out.append(f"- MiniLM training (batch 10, the wordnet suite's) at 2x today's samples/s: "
                   f"{ratio:.2f}x ({'met' if ratio >= 2 else 'not met'}; bf16 autocast and the fused AdamW step)")
    feats = [w for (name, _), w in rows.items() if name == "minilm infer"]
    if feats:
        best = max(feats, key=lambda w: w["fraction_of_peak"]["bf16"])
        frac = best["fraction_of_peak"]["bf16"]
        out.append(f"- frozen-feature extraction at 50% of the bf16 peak or more: {100 * frac:.0f}% at batch "
                   f"{best['batch']} ({'met' if frac >= 0.5 else 'not met'})")
    return out


def precision_section(p: dict[str, Any]) -> list[str]:
    lines = [f"### Paired fp32-vs-bf16 check (`{p['command']}`)", "",
             "A_T in % (per seed, mean); bf16 − fp32 paired over seeds (mean ± std, paired t); speed ratios "
             "bf16 / fp32 (median over seeds); the load average around the runs.", "",
             "| suite | method | test N | A_T fp32 | A_T bf16 | bf16 − fp32 | verdict | train/s ratio | infer/s ratio "
             "| load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for suite, entry in p["suites"].items():
        for method, m in entry["methods"].items():
            d = m["paired_bf16_minus_fp32"] or {}
            mean = {k: statistics.mean(v.values()) if v else float("nan") for k, v in m["A_T"].items()}
            ratio = {k: statistics.median(v["bf16_over_fp32"].values()) if v["bf16_over_fp32"] else None
                     for k, v in m["speed"].items()}
            loads = [x for runs in m["load_average"].values() for pair in runs.values() for x in pair]
            verdict = "within noise" if m["within_noise"] else d.get("verdict", "—")
            p_value = f", p {d['p']:.2f}" if d.get("p") is not None else ""
            lines.append(f"| {suite} | {method} | {entry.get('test_size') or '—'} | {mean['fp32']:.1f} | "
                         f"{mean['bf16']:.1f} | {d.get('mean', float('nan')):+.2f} ± {d.get('std', float('nan')):.2f} "
                         f"({d.get('n', 0)} seeds"
                         f"{p_value}) | {verdict} | {_x(ratio['train_samples_per_s'])} | "
                         f"{_x(ratio['infer_samples_per_s'])} | {_load_avg(loads)} |")
    return lines + [""]


def threads_section(t: dict[str, Any]) -> list[str]:
    lines = [f"### Threads (`{t['command']}`, {t['usable_cores']} usable cores)", "",
             f"{'Wall seconds' if t['measure'] == 'wall_s' else 'Training samples/s'} (median of runs); "
             "the other jobs on the machine are the competing load.", "",
             "| setting | threads | median | runs | load average |", "|---|---|---|---|---|"]
    for name, runs in t["runs"].items():
        if runs:
            loads = [x for r in runs for x in r["load_average"]]
            lines.append(f"| {name} | {runs[0].get('threads', '—')} | {t['median'][name]:.1f} | {len(runs)} | "
                         f"{_load_avg(loads)} |")
    return lines + [""]


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "—"


def markdown(folder: Path) -> str:
    from hf_clroute.backbones.precision import MEASURED_BY

    lines = ["## Mixed precision, roofline and threads", "",
             "Regenerate: `scripts/roofline.sh`, `scripts/precision_check.sh`, then "
             "`python -m hf_clroute.bench.reports.speed_report`. `auto` precision reads its table "
             f"(`hf_clroute/backbones/bf16_speedups.json`) from `{MEASURED_BY}` and this page's paired check.", ""]
    roofline = _load(folder / "roofline.json")
    if roofline:
        lines += roofline_section(roofline) + ["Targets:", ""] + targets(roofline) + [""]
    check = _load(folder / "precision_check.json")
    if check:
        lines += precision_section(check)
    threads = _load(folder / "threads.json")
    if threads:
        lines += threads_section(threads)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default="results/speed")
    parser.add_argument("--print", action="store_true", help="print the tables instead of writing README.md")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    section = f"{START}\n{markdown(folder)}\n{END}"
    if args.print:
        print(section)
        return section
    readme = folder / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END):]
    else:
        text = section + "\n\n" + text
    readme.write_text(text)
    print(f"wrote {readme}")
    return section


if __name__ == "__main__":
    main()
