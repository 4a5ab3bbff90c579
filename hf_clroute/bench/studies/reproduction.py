"""The reproduction table: each paper's headline claims against what our committed runs measure.

The claims live in ``results/reproduction/claims.json`` (by hand: ``{"claims": [...], "notes": {id: text}}``,
each claim with a unique ``id`` that keys its note, the paper's figure and what measures it). The rest is
computed from the committed ``results/*/results.json``, so the table cannot disagree with the runs:

* **our figure**: mean ± std over the seeds of each side; **paired**: per-seed differences ``a - b`` over
  the shared seeds (``paired_difference``, two-sided paired t; a claim may lower the seed minimum to 3);
* **Holm p**: the family is every paired test with a p over at least its seed minimum; its p-values are
  adjusted together by Holm's step-down (:func:`holm`); rows without one are outside the family;
* **the status**, one rule for every row: *not measured* (a side is not committed); *reproduced in
  direction* (Holm p < :data:`ALPHA` in the claimed direction, and a ratio claim reaches its target);
  *not reproduced* otherwise, naming the run that isolates why (``isolating_run``; a claim file without
  one is refused), unless only the correction took it away, which the row then says.

``compare``: ``greater`` (a > b), ``less`` (a < b), ``ratio_at_least`` (mean a / mean b >= ``target``,
a > b), ``ratio_at_most`` (mean a / mean b <= ``target``, a < b), ``near`` (abs(mean a - target) <=
``tolerance``, or the ratio a / b held to the target when a side b is given; no paired test).

A side reads ``metric`` of ``method`` in each ``per_seed`` row of ``results/<results>/results.json``, or,
when ``results`` names a ``.json`` file and no method is given, the one number at the dotted ``metric``
path there (list indices allowed). A side with ``minus`` (another results folder) reads the change: the
same metric there, subtracted seed by seed over the seeds both hold.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hf_clroute.errors import UserInputError
from hf_clroute.metrics.aggregate import format_mean_std, mean_std, paired_difference

COMPARES = ("greater", "less", "ratio_at_least", "ratio_at_most", "near")
#: the level a Holm-adjusted paired p must fall below for "reproduced in direction"
ALPHA = 0.05
#: a claim id: lower-case words joined by single hyphens, e.g. "rwf-vs-dualprompt-wordnet"
CLAIM_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
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
    id: str
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
    note: str = ""  # from the claims file's "notes" mapping, keyed by this claim's id
    tolerance: float | None = None

    @classmethod
    def from_dict(cls, raw: dict, where: str, note: str = "") -> "Claim":
        if "note" in raw:
            raise UserInputError(f"{where}: field 'note' is not read inside a claim; put it in the file's 'notes' "
                                 "mapping under the claim's id, so that it attaches to this row only")
        known = {"id", "paper", "claim", "paper_figure", "setting", "a", "b", "compare", "target", "tolerance",
                 "min_seeds", "isolating_run"}
        unknown = set(raw) - known
        if unknown:
            raise UserInputError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        for name in ("id", "paper", "claim", "paper_figure", "setting"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise UserInputError(f"{where}: field {name!r} must be a non-empty string")
        if not CLAIM_ID.fullmatch(raw["id"]):
            raise UserInputError(f"{where}: field 'id' must be lower-case words joined by single hyphens "
                                 f"(e.g. 'rwf-vs-dualprompt-wordnet'), got {raw['id']!r}")
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
        return cls(id=raw["id"], paper=raw["paper"], claim=raw["claim"], paper_figure=raw["paper_figure"],
                   setting=raw["setting"], compare=compare, target=raw.get("target"), tolerance=raw.get("tolerance"),
                   min_seeds=int(raw.get("min_seeds", 5)), isolating_run=raw.get("isolating_run", ""),
                   note=note, **sides)


def load_claims(path: Path) -> list[Claim]:
    """The claims of ``path``, each with its note (the ``notes`` mapping, keyed by claim id)."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("claims"), list):
        got = "an object without a 'claims' list" if isinstance(raw, dict) else type(raw).__name__
        raise UserInputError(f"{path}: expected a JSON object {{\"claims\": [...], \"notes\": {{id: text}}}}, "
                             f"got {got}")
    unknown = set(raw) - {"claims", "notes"}
    if unknown:
        raise UserInputError(f"{path}: unknown top-level field(s) {sorted(unknown)}; known: ['claims', 'notes']")
    notes = raw.get("notes", {})
    if not isinstance(notes, dict) or not all(isinstance(t, str) and t for t in notes.values()):
        raise UserInputError(f"{path}: field 'notes' must map claim ids to non-empty strings")
    claims, seen = [], set()
    for i, item in enumerate(raw["claims"]):
        where = f"{path} claim {i}"
        if not isinstance(item, dict):
            raise UserInputError(f"{where}: expected a JSON object, got {type(item).__name__}")
        claim = Claim.from_dict(item, where, note=notes.get(item.get("id"), ""))
        if claim.id in seen:
            raise UserInputError(f"{where}: field 'id' {claim.id!r} is used by an earlier claim; ids must be unique")
        seen.add(claim.id)
        claims.append(claim)
    orphans = sorted(set(notes) - seen)
    if orphans:
        raise UserInputError(f"{path}: field 'notes' names no claim with id(s) {orphans}")
    return claims


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment, in the input's order.

    With the m p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted p_(i) is
    max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where the adjusted p < alpha keeps the
    family-wise error rate at alpha under any dependence between the tests.
    """
    for p in pvalues:
        if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
            raise ValueError(f"a p-value must be a number in [0, 1], got {p!r}")
    m = len(pvalues)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda k: pvalues[k])):  # rank = j - 1
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def _measure(claim: Claim, root: Path) -> dict:
    """Our figures, the paired test and the ratio of one claim; the status waits for the family's Holm p."""
    out = {"claim": claim, "a": None, "b": None, "paired": None, "ratio": None, "measured": False}
    if claim.a is None:
        return out
    a = claim.a.per_seed(root)
    b = claim.b.per_seed(root) if claim.b is not None else None
    if a is None or (claim.b is not None and b is None):
        return out
    out["measured"] = True
    out["a"] = mean_std(list(a.values()))
    if b is not None:
        out["b"] = mean_std(list(b.values()))
    if claim.compare == "near":
        out["ratio"] = None if b is None else out["a"]["mean"] / out["b"]["mean"]
        return out
    out["paired"] = paired_difference(a, b, alpha=ALPHA, min_seeds=claim.min_seeds)
    if claim.compare.startswith("ratio") and out["b"]["mean"] != 0:
        out["ratio"] = out["a"]["mean"] / out["b"]["mean"]
    return out


def _in_family(got: dict) -> bool:
    paired = got["paired"]
    return paired is not None and paired["p"] is not None and paired["n"] >= got["claim"].min_seeds


def _holds(claim: Claim, got: dict, p: float | None) -> bool:
    """The claim holds at ``p``: below ALPHA in the claimed direction, and a ratio claim reaches its target."""
    paired = got["paired"]
    if p is None or p >= ALPHA or paired["mean"] == 0:
        return False
    if (paired["mean"] > 0) != (claim.compare in ("greater", "ratio_at_least")):
        return False
    if claim.compare == "ratio_at_least":
        return got["ratio"] is not None and got["ratio"] >= claim.target
    if claim.compare == "ratio_at_most":
        return got["ratio"] is not None and got["ratio"] <= claim.target
    return True


def assess_all(claims: Sequence[Claim], root: Path) -> list[dict]:
    """Every claim's figures, paired test, Holm p over the family and status (see the module docstring).

    Each result: ``a``, ``b`` (mean ± std), ``paired``, ``ratio``, ``p_holm`` (None outside the family),
    ``family_size``, ``status``, and ``corrected_away`` (the claim holds at the raw p, not at Holm's).
    """
    got = [_measure(claim, root) for claim in claims]
    family = [g for g in got if _in_family(g)]
    for g, adjusted in zip(family, holm([g["paired"]["p"] for g in family])):
        g["p_holm"] = adjusted
    for claim, g in zip(claims, got):
        g.setdefault("p_holm", None)
        g["family_size"], g["corrected_away"] = len(family), False
        if not g["measured"]:
            g["status"] = "not measured"
        elif claim.compare == "near":
            value = g["a"]["mean"] if g["ratio"] is None else g["ratio"]
            g["status"] = "reproduced" if abs(value - claim.target) <= claim.tolerance else "not reproduced"
        else:
            holds = _in_family(g) and _holds(claim, g, g["p_holm"])
            g["corrected_away"] = not holds and _in_family(g) and _holds(claim, g, g["paired"]["p"])
            g["status"] = "reproduced in direction" if holds else "not reproduced"
        if g["status"] == "not reproduced" and not g["corrected_away"] and not claim.isolating_run:
            raise UserInputError(f"claim {claim.id!r} ({claim.paper}: {claim.claim!r}) is not reproduced by the "
                                 "committed runs and names no isolating_run; say which run isolates why")
    return got


def assess(claim: Claim, root: Path) -> dict:
    """One claim on its own: a family of one, so its Holm p is its raw p."""
    return assess_all([claim], root)[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a literal pipe would split the Markdown cell


def _figure(stat: dict | None, digits: int = 2) -> str:
    return format_mean_std(stat, scale=1, digits=digits, missing="n/a")


def _p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _paired_cell(got: dict) -> str:
    paired, ratio = got["paired"], got["ratio"]
    if paired is None:
        return "n/a" if ratio is None else f"ratio {ratio:.2f}x (no paired test)"
    # "better"/"worse" would read against claims where lower wins (perplexity, a drop), so the cell says a > b.
    if paired["verdict"] == "too few seeds":
        relation = "too few seeds"
    elif got["p_holm"] is not None and got["p_holm"] < ALPHA and paired["mean"] != 0:
        relation = "a > b" if paired["mean"] > 0 else "a < b"
    else:
        relation = "tie"
    cell = (f"{paired['mean']:+.2f} ± {paired['std']:.2f} "
            f"(a > b on {paired['wins']}/{paired['n']} seeds; Holm: {relation})")
    return cell + (f"; ratio {ratio:.2f}x" if ratio is not None else "")


def _status_cell(claim: Claim, got: dict) -> str:
    status = got["status"]
    if got["corrected_away"]:
        status += f": in the claimed direction at p < {ALPHA:g} before Holm's correction only"
        if claim.isolating_run:
            status += f"; {claim.isolating_run}"
    elif status == "not reproduced":
        status += f": {claim.isolating_run}"
    elif status == "not measured" and claim.isolating_run:
        status += f" ({claim.isolating_run})"
    return status + (" (see its note)" if claim.note else "")


def reproduction_table(results_root: Path) -> str:
    """The BENCHMARKS.md section: one row per claim, '' when no claims file is committed."""
    path = results_root / CLAIMS_FILE
    if not path.exists():
        return ""
    claims = load_claims(path)
    assessed = assess_all(claims, results_root)
    family = assessed[0]["family_size"] if assessed else 0
    outside = len(assessed) - family
    lost = sum(g["corrected_away"] for g in assessed)
    lines = [
        "## Reproduction: the papers' headline claims\n",
        f"Claims, their ids and notes: `{CLAIMS_FILE.as_posix()}` under the results folder; our figures, paired "
        "verdicts and statuses are computed from the committed results (`hf_clroute/bench/studies/reproduction.py`). "
        "Our figure: a and b, mean ± std over seeds. Paired: a - b per seed, the seeds where a > b, and the "
        "relation the Holm-adjusted test finds (a claim that lower wins, such as a perplexity or a drop, wants "
        "a < b). p: the paired t-test's two-sided p. Holm p: that p adjusted by Holm's step-down over the "
        f"table's family, the {family} paired t-tests of the rows that have one (each on at least its seed "
        f"minimum); the other {outside} rows have no test (not measured, a 'near' comparison, or a pair below "
        "its seed minimum) and are outside the family. The status uses the Holm p: reproduced in direction when "
        f"it is below {ALPHA:g} in the claimed direction (and a ratio claim reaches its target). {lost} "
        f"row{'s' if lost != 1 else ''} in the claimed direction at p < {ALPHA:g} before the correction "
        f"{'are' if lost != 1 else 'is'} not reproduced after it, and say{'' if lost != 1 else 's'} so. "
        "A note below is keyed by its row's id.\n",
        "```bash\n" + "\n".join(COMMANDS) + "\n```\n",
        "| id | paper | claim | paper's figure | our setting | ours: a / b | paired a - b | p | Holm p | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for claim, got in zip(claims, assessed):
        seeds = f" (paired test on {claim.min_seeds}+ seeds)" if claim.min_seeds != 5 else ""
        ours = "n/a" if got["a"] is None else _figure(got["a"]) + (f" / {_figure(got['b'])}" if got["b"] else "")
        raw_p = got["paired"]["p"] if got["paired"] is not None else None
        cells = [f"`{claim.id}`", claim.paper, claim.claim, claim.paper_figure, claim.setting + seeds, ours,
                 _paired_cell(got), _p(raw_p), _p(got["p_holm"]), _status_cell(claim, got)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    taken = [f"`{c.id}` (p {_p(g['paired']['p'])}, Holm p {_p(g['p_holm'])})"
             for c, g in zip(claims, assessed) if g["corrected_away"]]
    lines += ["", "Taken away by the correction (in the claimed direction at p < "
              f"{ALPHA:g} before it): " + ("; ".join(taken) if taken else "none") + "."]
    notes = [f"- `{c.id}` ({c.paper}, {c.claim}): {c.note}" for c in claims if c.note]
    return "\n".join(lines) + "\n" + ("\nNotes:\n" + "\n".join(notes) + "\n" if notes else "") + "\n"
