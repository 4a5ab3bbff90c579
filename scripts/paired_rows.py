"""Paired per-seed comparisons for the reproduction rows (issue 32), from a merged results.json.

``python scripts/paired_rows.py results.json out.json METRIC:A/B ...`` writes, for each pair, the
per-seed values of METRIC for A and B (a per-seed row's scalar, or the first element of a list such
as the char-LM runner's ``adaptation``), their paired differences A - B, mean ± std, how many seeds
have A below B, and a paired t-test p-value (two-sided; None with fewer than 2 seeds).
"""

from __future__ import annotations

import json
import sys

import numpy as np
from scipy import stats


def value(row: dict, metric: str) -> float:
    v = row[metric]
    return float(v[0] if isinstance(v, list) else v)


def main(path: str, out: str, pairs: list[str]) -> None:
    results = json.load(open(path))
    report = {"source": path, "seeds": results["seeds"], "pairs": {}}
    for spec in pairs:
        metric, _, names = spec.partition(":")
        a, b = names.split("/")
        rows = {name: {r["seed"]: r for r in results["methods"][name]["per_seed"]} for name in (a, b)}
        seeds = sorted(set(rows[a]) & set(rows[b]))
        va = [value(rows[a][s], metric) for s in seeds]
        vb = [value(rows[b][s], metric) for s in seeds]
        diff = np.subtract(va, vb)
        p = float(stats.ttest_rel(va, vb).pvalue) if len(seeds) > 1 else None
        report["pairs"][spec] = {"seeds": seeds, a: va, b: vb, "difference": diff.tolist(),
                                 "mean": float(diff.mean()), "std": float(diff.std(ddof=1)) if len(seeds) > 1 else None,
                                 "a_below_b": int((diff < 0).sum()), "p_value": p}
    json.dump(report, open(out, "w"), indent=1)
    for spec, r in report["pairs"].items():
        print(f"{spec}: {r['mean']:+.4f} (std {r['std']}, p {r['p_value']}, {r['a_below_b']}/{len(r['seeds'])} seeds below)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
