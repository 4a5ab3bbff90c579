"""The reproduction table: each paper's headline claims against what our committed runs measure.

The claims live in ``results/reproduction/claims.json`` (written by hand: what each paper reports,
and which committed results measure it). Everything else is computed here from the committed
``results/*/results.json``, so the table can never disagree with the runs:

* **our figure**: mean ± std over the seeds of each side of the claim;
* **the paired verdict**: per-seed differences ``a - b`` over the seeds both sides share
  (``metrics.aggregate.paired_difference``; a claim may lower the seed minimum to 3 for the costly
  LM and plasticity runs, and the row says so);
* **the status**, by one rule for every row:
  - *not measured*: a side's results or row is not committed;
  - *reproduced in direction*: the paired difference is significant (p < 0.05) in the claimed
    direction, and a ratio claim also reaches its ratio target;
  - *not reproduced*: otherwise. Such a row must name the run that isolates why
    (``isolating_run``); a claim file without one is refused.

A claim's ``compare`` is one of ``greater`` (a > b), ``less`` (a < b), ``ratio_at_least``
(mean a / mean b >= ``target``, a > b), ``ratio_at_most`` (mean a / mean b <= ``target``, a < b), and
``near`` (abs(mean a - target) <= ``tolerance``, "reproduced" when it holds; with a side b, the ratio
mean a / mean b is held to the target instead, e.g. a parameter count against another's: no paired test,
for counts that do not vary by seed).

A side reads ``metric`` of ``method`` in each ``per_seed`` row of ``results/<results>/results.json``, or,
when ``results`` names a ``.json`` file and no method is given, the one number at the dotted ``metric``
path in that file (list indices allowed), for measurements that have no seeds. A side with ``minus``
(another results directory) reads a change instead: the same metric of the same method there, subtracted
seed by seed over the seeds both hold (e.g. the drop in A_T from 5 to 40 tasks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from hf_clroute.errors import UserInputError
from hf_clroute.metrics.aggregate import format_mean_std, mean_std, paired_difference

COMPARES = ("greater", "less", "ratio_at_least", "ratio_at_most", "near")
CLAIMS_FILE = Path("reproduction") / "claims.json"
#: the commands that remake the results the claims read (each script's header says what it runs)
COMMANDS = (
    "scripts/mars_ablations.sh validate && scripts/mars_ablations.sh rows && scripts/mars_ablations.sh paired",
    "SEEDS='0 1 2 3 4' scripts/apn_repro.sh   # char-level Shakespeare, then KJV: dense vs APN, 5 seeds",
    "SUITE=charlm-shakespeare-kjv-long scripts/apn_repro.sh   # the same, ten times longer (converged), 3 seeds",
    ("SEEDS='0 1 2 3 4' scripts/qoa_plasticity.sh   # 7x7 permuted MNIST, 120 tasks: backprop, continual "
     "backprop, QOA"),
    ("SEEDS='0 1 2 3 4' METHODS=qoa-s1000 scripts/qoa_plasticity.sh   # QOA at the paper's support of 1000, "
     "same streams"),
    "scripts/reproduce_tables.sh     # drifting-regression, permuted-mnist, split-mnist-buffer (3 seeds)",
    "scripts/main_tables.sh all      # the main tables: the ER and EWC rows MaRS is set against",
    ("python training/prompt_share.py --out results/prompt-share.json   # RwF's and the prompt methods' "
     "parameter shares"),
    "scripts/room_suite.sh           # Split-MNIST-R: its backbone and its headroom study",
    "SEEDS=0,1,2 scripts/main_tables.sh counts   # wordnet in 5/10/20/40 tasks: RwF, its control, streaming LDA",
    "hf-clroute report               # this page",
)


@dataclass(frozen=True)
class Side:
    """One measured quantity: ``metric`` of ``method`` in ``results/<results>/results.json``, per seed."""

    results: str
    metric: str
    method: str | None = None
    scale: float = 1.0  # e.g. 100 to print a fraction as %
    minus: str | None = None  # results/<minus>: read there too and subtracted, seed by seed

    def per_seed(self, root: Path) -> dict[int, float] | None:
        if self.minus is not None:
            here = replace(self, minus=None).per_seed(root)
            there = replace(self, results=self.minus, minus=None).per_seed(root)
            if here is None or there is None:
                return None
            return {seed: here[seed] - there[seed] for seed in sorted(here.keys() & there.keys())} or None
        if self.method is None:  # one number in a JSON file, no seeds
            path = root / self.results
            value = _dig(json.loads(path.read_text()), self.metric) if path.exists() else None
            return None if value is None else {0: float(value) * self.scale}
        path = root / self.results / "results.json"
        if not path.exists():
            return None
        rows = json.loads(path.read_text()).get("methods", {})
        row = rows.get(self.method)
        if row is None:
            return None
        values = {}
        for seed_row in row.get("per_seed", []):
            value = _dig(seed_row, self.metric)
            if value is not None:
                values[int(seed_row["seed"])] = float(value) * self.scale
        return values or None


def _dig(node, dotted: str):
    for key in dotted.split("."):
        if isinstance(node, list) and key.lstrip("-").isdigit() and -len(node) <= int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return None
    return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str
    paper_figure: str
    setting: str
    a: Side | None = None
    b: Side | None = None
    compare: str = "greater"
    target: float | None = None
    min_seeds: int = 5
    isolating_run: str = ""
    note: str = ""
    tolerance: float | None = None

    @classmethod
    def from_dict(cls, raw: dict, where: str) -> "Claim":
        known = {"paper", "claim", "paper_figure", "setting", "a", "b", "compare", "target", "tolerance",
                 "min_seeds", "isolating_run", "note"}
        unknown = set(raw) - known
        if unknown:
            raise UserInputError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        for name in ("paper", "claim", "paper_figure", "setting"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise UserInputError(f"{where}: field {name!r} must be a non-empty string")
        compare = raw.get("compare", "greater")
        if compare not in COMPARES:
            raise UserInputError(f"{where}: field 'compare' must be one of {COMPARES}, got {compare!r}")
        if (compare.startswith("ratio") or compare == "near") and not isinstance(raw.get("target"), (int, float)):
            raise UserInputError(f"{where}: a {compare!r} claim needs a numeric 'target'")
        if compare == "near" and not isinstance(raw.get("tolerance"), (int, float)):
            raise UserInputError(f"{where}: a 'near' claim needs a numeric 'tolerance'")
        sides = {}
        for name in ("a", "b"):
            if raw.get(name) is not None:
                try:
                    sides[name] = Side(**raw[name])
                except TypeError as err:
                    raise UserInputError(f"{where}: field {name!r}: {err}") from None
                if sides[name].minus is not None and sides[name].method is None:
                    raise UserInputError(f"{where}: field {name!r}: 'minus' subtracts a method's per-seed rows; "
                                         "name its 'method'")
        if compare == "near" and "b" in sides and "a" not in sides:
            raise UserInputError(f"{where}: a 'near' claim measures side 'a' (or the ratio a / b) against its target")
        if compare != "near" and ("a" in sides) != ("b" in sides):
            raise UserInputError(f"{where}: a {compare!r} claim measures both sides 'a' and 'b', or neither")
        return cls(paper=raw["paper"], claim=raw["claim"], paper_figure=raw["paper_figure"],
                   setting=raw["setting"], compare=compare, target=raw.get("target"), tolerance=raw.get("tolerance"),
                   min_seeds=int(raw.get("min_seeds", 5)), isolating_run=raw.get("isolating_run", ""),
                   note=raw.get("note", ""), **sides)


def load_claims(path: Path) -> list[Claim]:
    raw = json.loads(path.read_text())
    if not isinstance(raw, list):
        raise UserInputError(f"{path}: expected a JSON list of claims, got {type(raw).__name__}")
    return [Claim.from_dict(item, f"{path} claim {i}") for i, item in enumerate(raw)]


def assess(claim: Claim, root: Path) -> dict:
    """Our figure, the paired verdict and the status of one claim (see the module docstring)."""
    out = {"claim": claim, "a": None, "b": None, "paired": None, "ratio": None, "status": "not measured"}
    if claim.a is None:
        return out
    if claim.compare == "near":
        a = claim.a.per_seed(root)
        b = claim.b.per_seed(root) if claim.b is not None else None
        if a is None or (claim.b is not None and b is None):
            return out
        out["a"] = mean_std(list(a.values()))
        measured = out["a"]["mean"]
        if b is not None:
            out["b"] = mean_std(list(b.values()))
            measured = out["ratio"] = out["a"]["mean"] / out["b"]["mean"]
        out["status"] = "reproduced" if abs(measured - claim.target) <= claim.tolerance else "not reproduced"
        return _checked(claim, out)
    a, b = claim.a.per_seed(root), claim.b.per_seed(root)
    if a is None or b is None:
        return out
    out["a"], out["b"] = mean_std(list(a.values())), mean_std(list(b.values()))
    paired = paired_difference(a, b, min_seeds=claim.min_seeds)
    out["paired"] = paired
    want_greater = claim.compare in ("greater", "ratio_at_least")
    significant = paired is not None and paired["verdict"] == ("better" if want_greater else "worse")
    if claim.compare.startswith("ratio") and out["b"]["mean"] != 0:
        out["ratio"] = out["a"]["mean"] / out["b"]["mean"]
        if claim.compare == "ratio_at_least":
            significant = significant and out["ratio"] >= claim.target
        else:
            significant = significant and out["ratio"] <= claim.target
    out["status"] = "reproduced in direction" if significant else "not reproduced"
    return _checked(claim, out)


def _checked(claim: Claim, out: dict) -> dict:
    if out["status"] == "not reproduced" and not claim.isolating_run:
        raise UserInputError(f"claim {claim.paper}: {claim.claim!r} is not reproduced by the committed runs and names "
                             "no isolating_run; say which run isolates why")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a literal pipe would split the Markdown cell


def _figure(stat: dict | None, digits: int = 2) -> str:
    return format_mean_std(stat, scale=1, digits=digits, missing="n/a")


_RELATION = {"better": "a > b", "worse": "a < b"}


def _paired_cell(paired: dict | None, ratio: float | None) -> str:
    if paired is None:
        return "n/a" if ratio is None else f"ratio {ratio:.2f}x (no paired test)"
    p = "n/a" if paired["p"] is None else ("< 0.001" if paired["p"] < 0.001 else f"{paired['p']:.3f}")
    # "better"/"worse" would read against claims where lower wins (perplexity, a drop), so the cell says a > b.
    verdict = _RELATION.get(paired["verdict"], paired["verdict"])
    cell = (f"{paired['mean']:+.2f} ± {paired['std']:.2f} "
            f"(a > b on {paired['wins']}/{paired['n']} seeds, p {p}: {verdict})")
    return cell + (f"; ratio {ratio:.2f}x" if ratio is not None else "")


def reproduction_table(results_root: Path) -> str:
    """The BENCHMARKS.md section: one row per claim, '' when no claims file is committed."""
    path = results_root / CLAIMS_FILE
    if not path.exists():
        return ""
    lines = [
        "## Reproduction: the papers' headline claims\n",
        f"Claims and their settings: `{CLAIMS_FILE.as_posix()}` under the results folder; our figures, paired "
        "verdicts and statuses are computed from the committed results (`hf_clroute/bench/studies/reproduction.py`). "
        "Our figure: a and b, mean ± std over seeds; paired: a - b per seed, paired t (p < 0.05), the seeds where "
        "a > b, and the relation the test finds (a claim that lower wins, such as a perplexity or a drop, "
        "wants a < b).\n",
        "```bash\n" + "\n".join(COMMANDS) + "\n```\n",
        "| paper | claim | paper's figure | our setting | ours: a / b | paired a - b | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for claim in load_claims(path):
        got = assess(claim, results_root)
        status = got["status"]
        if status == "not reproduced":
            status += f": {claim.isolating_run}"
        elif status == "not measured" and claim.isolating_run:
            status += f" ({claim.isolating_run})"
        seeds = f" (paired test on {claim.min_seeds}+ seeds)" if claim.min_seeds != 5 else ""
        ours = "n/a" if got["a"] is None else _figure(got["a"]) + (f" / {_figure(got['b'])}" if got["b"] else "")
        cells = [claim.paper, claim.claim, claim.paper_figure, claim.setting + seeds, ours,
                 _paired_cell(got["paired"], got["ratio"]), status]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    notes = [f"- {c.paper}, {c.claim}: {c.note}" for c in load_claims(path) if c.note]
    return "\n".join(lines) + "\n" + ("\nNotes:\n" + "\n".join(notes) + "\n" if notes else "") + "\n"
