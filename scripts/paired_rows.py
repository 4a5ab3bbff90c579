"""Per-seed paired differences of A_T between rows of one committed table, for comparisons that the
table's own verdicts (each row against its control and the best statistics head) do not make.

    python scripts/paired_rows.py results/split-mnist er:mars rwf:l2p --out results/paired/split-mnist.json

Prints one line per pair (mean ± std of a − b in points, the seeds where a is higher, the paired t's p
and the verdict, the same rule as the tables') and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_clroute.io import atomic_write_text
from hf_clroute.metrics.aggregate import paired_difference


def pairs_table(results_dir: Path, pairs: list[str]) -> list[dict]:
    rows = json.loads((results_dir / "results.json").read_text())["methods"]
    out = []
    for pair in pairs:
        a, b = pair.split(":")
        missing = [m for m in (a, b) if m not in rows]
        if missing:
            raise SystemExit(f"{results_dir}: no row {missing[0]!r} (rows: {', '.join(sorted(rows))})")
        seeds = [{r["seed"]: r["A_T"] for r in rows[m]["per_seed"]} for m in (a, b)]
        out.append({"a": a, "b": b, **paired_difference(*seeds)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results folder with results.json")
    parser.add_argument("pairs", nargs="+", help="a:b, the rows to compare (a − b)")
    parser.add_argument("--out", type=Path, help="where to write the JSON")
    args = parser.parse_args()
    table = pairs_table(args.results, args.pairs)
    for d in table:
        print(f"{d['a']} − {d['b']}: {d['mean'] * 100:+.1f} ± {d['std'] * 100:.1f} "
              f"({d['wins']} of {d['n']}, p {d['p']:.2g}): {d['verdict']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps({"results": str(args.results), "pairs": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
