"""Per-seed paired differences between rows of one committed table, for comparisons that the table's own
verdicts (each row against its control and the best statistics head) do not make.

    python scripts/paired_rows.py results/split-mnist er:mars rwf:l2p --out results/paired/split-mnist.json
    python scripts/paired_rows.py results/apn-shakespeare-kjv retention:apn-all/dense-all --out ...
    python scripts/paired_rows.py results/wordnet-5tasks --minus results/wordnet-20tasks rwf:dualprompt --out ...

A pair is ``a:b`` (A_T, printed in points) or ``METRIC:a/b`` (any per-seed field: a number, or the first
element of a list such as the char-LM runner's ``adaptation``; ``FIELD.i.j`` indexes into nested lists, so
``ppl_matrix.1.0`` is the char-LM runner's perplexity on domain A after training on B). Prints one line per pair
(mean ± std of a − b, the seeds where a is higher, the paired t's p and the verdict, the same rule as the tables') and
writes them as JSON with each side's per-seed values. With ``--minus OTHER`` each side is its row's value
minus the same row's value in OTHER on the same seed (a drop, such as A_T from 5 to 20 tasks), so a pair
compares two rows' drops seed by seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_clroute.core.registry import method_key
from hf_clroute.hub.io import atomic_write_text
from hf_clroute.metrics.aggregate import paired_difference


def parse_pair(spec: str) -> tuple[str, str, str]:
    """``a:b`` -> ("A_T", a, b); ``METRIC:a/b`` -> (METRIC, a, b)."""
    head, sep, tail = spec.partition(":")
    if not sep or not head or not tail:
        raise SystemExit(f"pair {spec!r}: expected a:b or METRIC:a/b")
    if "/" in tail:
        a, _, b = tail.partition("/")
        return head, a, b
    return "A_T", head, tail


def seed_values(row: dict, metric: str, method: str) -> dict[int, float]:
    field, *index = metric.split(".")
    values = {}
    for seed_row in row["per_seed"]:
        where = f"row {method!r}, seed {seed_row['seed']}"
        if field not in seed_row:
            raise SystemExit(f"{where}: no field {field!r}")
        v = seed_row[field]
        for i in index:
            if not (i.isdigit() and isinstance(v, list) and int(i) < len(v)):
                raise SystemExit(f"{where}: {metric!r} does not index field {field!r}")
            v = v[int(i)]
        values[seed_row["seed"]] = float(v[0] if isinstance(v, list) else v)
    return values


def load_rows(results: Path) -> dict:
    path = results if results.suffix == ".json" else results / "results.json"
    return json.loads(path.read_text())["methods"]


def row(results: Path, rows: dict, method: str) -> dict:
    key = method_key(rows, method)  # rows written before the one-separator rename keep old names
    if key is None:
        raise SystemExit(f"{results}: no row {method!r} (rows: {', '.join(sorted(rows))})")
    return rows[key]


def pairs_table(results: Path, pairs: list[str], minus: Path | None = None) -> list[dict]:
    rows = load_rows(results)
    minus_rows = load_rows(minus) if minus is not None else None

    def side(metric: str, method: str) -> dict[int, float]:
        """A row's per-seed values; with ``minus``, less the same row's there (the seeds both ran)."""
        values = seed_values(row(results, rows, method), metric, method)
        if minus_rows is None:
            return values
        other = seed_values(row(minus, minus_rows, method), metric, method)
        if not set(values) & set(other):
            raise SystemExit(f"row {method!r}: no seed in both {results} and {minus}")
        return {s: values[s] - other[s] for s in sorted(set(values) & set(other))}

    out = []
    for spec in pairs:
        metric, a, b = parse_pair(spec)
        values = [side(metric, m) for m in (a, b)]
        out.append({"a": a, "b": b, "metric": metric, **paired_difference(*values),
                    "a_per_seed": values[0], "b_per_seed": values[1]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results folder with results.json (or that file)")
    parser.add_argument("pairs", nargs="+", help="a:b (A_T) or METRIC:a/b, the rows to compare (a − b)")
    parser.add_argument("--minus", type=Path, help="a second results folder: pair each row's value minus its value "
                        "there on the same seed (a drop between two settings)")
    parser.add_argument("--out", type=Path, help="where to write the JSON")
    args = parser.parse_args()
    table = pairs_table(args.results, args.pairs, args.minus)
    for d in table:
        scale, unit = (100, "") if d["metric"] == "A_T" else (1, f" {d['metric']}")
        mean = round(d["mean"] * scale, 9)  # a mean of float noise (8e-16) prints as +0
        p = "n/a" if d["p"] is None else f"{d['p']:.2g}"
        if d["n"] == 1:  # one seed has no spread and no test
            print(f"{d['a']} − {d['b']}{unit}: {mean:+.3g} (one seed, no test)")
        else:
            print(f"{d['a']} − {d['b']}{unit}: {mean:+.3g} ± {d['std'] * scale:.2g} "
                  f"({d['wins']} of {d['n']}, p {p}): {d['verdict']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        written = {"results": str(args.results), **({"minus": str(args.minus)} if args.minus else {}), "pairs": table}
        atomic_write_text(args.out, json.dumps(written, indent=2) + "\n")


if __name__ == "__main__":
    main()
