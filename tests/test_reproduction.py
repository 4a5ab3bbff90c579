"""The reproduction table: statuses follow one rule (Holm-adjusted paired p), notes attach by claim id."""

import json
from pathlib import Path

import pytest

from hf_clroute.bench.studies.reproduction import (
    ALPHA,
    CLAIMS_FILE,
    assess,
    assess_all,
    holm,
    load_claims,
    reproduction_table,
)
from hf_clroute.errors import UserInputError


def _results(root: Path, suite: str, rows: dict[str, list[float]]) -> None:
    methods = {m: {"per_seed": [{"seed": s, "A_T": v} for s, v in enumerate(vals)]} for m, vals in rows.items()}
    (root / suite).mkdir(parents=True, exist_ok=True)
    (root / suite / "results.json").write_text(json.dumps({"methods": methods}))


def _claim(**extra) -> dict:
    return {"paper": "P", "claim": "a beats b", "paper_figure": "2 vs 1", "setting": "s",
            "a": {"results": "s", "method": "a", "metric": "A_T"},
            "b": {"results": "s", "method": "b", "metric": "A_T"}, **extra}


def _write_claims(root: Path, claims: list[dict], notes: dict | None = None) -> Path:
    """The claims file; a claim without an id gets ``c<index>``."""
    path = root / CLAIMS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    claims = [{"id": f"c{i}", **c} for i, c in enumerate(claims)]
    path.write_text(json.dumps({"claims": claims, "notes": notes or {}}))
    return path


def test_status_follows_the_paired_test_and_the_ratio(tmp_path):
    _results(tmp_path, "s", {"a": [0.60, 0.62, 0.61, 0.63, 0.60], "b": [0.30, 0.31, 0.29, 0.32, 0.30],
                             "c": [0.59, 0.64, 0.58, 0.65, 0.61]})
    claims = load_claims(_write_claims(tmp_path, [
        _claim(),
        _claim(compare="ratio_at_least", target=1.5),
        _claim(compare="ratio_at_least", target=2.5, isolating_run="run X"),
        _claim(b={"results": "s", "method": "c", "metric": "A_T"}, isolating_run="run Y"),
        _claim(a={"results": "s", "method": "missing", "metric": "A_T"}),
    ]))
    got = [assess(c, tmp_path) for c in claims]
    assert got[0]["status"] == "reproduced in direction" and got[0]["paired"]["verdict"] == "better"
    assert got[1]["status"] == "reproduced in direction" and got[1]["ratio"] == pytest.approx(0.612 / 0.304, rel=1e-3)
    assert got[2]["status"] == "not reproduced"  # significant, but the ratio misses its target
    assert got[3]["status"] == "not reproduced"  # a tie with c
    assert got[4]["status"] == "not measured"


def test_a_side_with_minus_reads_the_change_seed_by_seed(tmp_path):
    _results(tmp_path, "few", {"a": [0.60, 0.62, 0.61, 0.63, 0.60], "b": [0.50, 0.52, 0.51, 0.53, 0.50]})
    _results(tmp_path, "many", {"a": [0.58, 0.61, 0.60, 0.60], "b": [0.30, 0.31, 0.29, 0.32, 0.30]})
    drop = lambda m: {"results": "few", "minus": "many", "method": m, "metric": "A_T", "scale": 100}
    claim = load_claims(_write_claims(tmp_path, [_claim(a=drop("a"), b=drop("b"), compare="less", min_seeds=3)]))[0]
    assert claim.a.per_seed(tmp_path) == pytest.approx({0: 2.0, 1: 1.0, 2: 1.0, 3: 3.0})  # seed 4: "many" lacks it
    got = assess(claim, tmp_path)
    assert got["status"] == "reproduced in direction" and got["paired"]["n"] == 4
    # the row states the relation found, not "worse", beside a claim where lower wins
    row = next(line for line in reproduction_table(tmp_path).splitlines() if line.startswith("| `c0` | P |"))
    assert "(a > b on 0/4 seeds; Holm: a < b) | " in row and " | reproduced in direction |" in row
    with pytest.raises(UserInputError, match="'minus' subtracts"):
        load_claims(_write_claims(tmp_path, [_claim(a={"results": "x.json", "minus": "y", "metric": "m"})]))


def test_a_failed_claim_must_name_its_isolating_run(tmp_path):
    _results(tmp_path, "s", {"a": [0.5] * 5, "b": [0.5] * 5})
    claim = load_claims(_write_claims(tmp_path, [_claim()]))[0]
    with pytest.raises(UserInputError, match="isolating_run"):
        assess(claim, tmp_path)


def test_fewer_seeds_allowed_only_where_the_claim_says_so(tmp_path):
    _results(tmp_path, "s", {"a": [0.60, 0.62, 0.61], "b": [0.30, 0.31, 0.29]})
    five, three = load_claims(_write_claims(tmp_path, [_claim(isolating_run="too few seeds"), _claim(min_seeds=3)]))
    assert assess(five, tmp_path)["paired"]["verdict"] == "too few seeds"
    assert assess(five, tmp_path)["status"] == "not reproduced"
    assert assess(three, tmp_path)["status"] == "reproduced in direction"


def test_near_reads_one_number_from_a_file(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps([{"pct": 2.08}]))
    near = {"paper": "P", "claim": "c", "paper_figure": "2.13%", "setting": "s", "compare": "near",
            "target": 2.13, "tolerance": 0.1, "a": {"results": "x.json", "metric": "0.pct"}}
    far = dict(near, tolerance=0.01, isolating_run="run Z")
    ok, off = load_claims(_write_claims(tmp_path, [near, far]))
    assert assess(ok, tmp_path)["status"] == "reproduced"
    assert assess(off, tmp_path)["status"] == "not reproduced"


def test_near_with_two_sides_holds_their_ratio_to_the_target(tmp_path):
    _results(tmp_path, "lm", {"big": [1114240] * 3, "small": [526848] * 3})  # the same count on every seed
    claim = {"paper": "P", "claim": "about 2.2x the parameters", "paper_figure": "2.2x", "setting": "s",
             "compare": "near", "target": 2.2, "tolerance": 0.2,
             "a": {"results": "lm", "method": "big", "metric": "A_T"},
             "b": {"results": "lm", "method": "small", "metric": "A_T"}}
    got = assess(load_claims(_write_claims(tmp_path, [claim]))[0], tmp_path)
    assert got["status"] == "reproduced" and abs(got["ratio"] - 1114240 / 526848) < 1e-12 and got["paired"] is None
    strict = assess(load_claims(_write_claims(tmp_path, [dict(claim, tolerance=0.05, isolating_run="r")]))[0], tmp_path)
    assert strict["status"] == "not reproduced"
    row = [line for line in reproduction_table(tmp_path).splitlines() if "2.2x the" in line][0]
    assert "ratio 2.11x (no paired test)" in row


@pytest.mark.parametrize("bad, field", [
    ({"compare": "bigger"}, "compare"),
    ({"compare": "ratio_at_least"}, "target"),
    ({"claim": ""}, "claim"),
    ({"colour": 1}, "colour"),
    ({"b": None}, "'b'"),
    ({"id": ""}, "'id'"),
    ({"id": "Not An Id"}, "'id'"),
    ({"note": "n"}, "'notes' mapping"),
])
def test_bad_claims_name_the_field(tmp_path, bad, field):
    path = _write_claims(tmp_path, [_claim(**bad)])
    with pytest.raises(UserInputError, match=field):
        load_claims(path)


def test_pipes_in_a_claim_do_not_split_cells(tmp_path):
    _results(tmp_path, "s", {"a": [0.6] * 5, "b": [0.3] * 5})
    _write_claims(tmp_path, [_claim(claim="linear in |S|")])
    row = [line for line in reproduction_table(tmp_path).splitlines() if "linear in" in line][0]
    assert row.count(" | ") == 9


def test_the_committed_claims_render():
    root = Path(__file__).resolve().parent.parent / "results"
    table = reproduction_table(root)
    assert table.count("\n| ") - 1 == len(load_claims(root / CLAIMS_FILE))


def test_holm_on_a_hand_example():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1, and never below a smaller p's
    assert holm([0.02, 0.02]) == pytest.approx([0.04, 0.04]) and holm([]) == [] and holm([0.3]) == [0.3]
    with pytest.raises(ValueError, match="p-value"):
        holm([0.1, 1.5])


def test_the_status_reads_the_holm_p_over_the_table(tmp_path):
    """Three copies of a claim at p 0.045: each holds on its own, none after Holm over the three;
    a 'near' claim has no test and stays outside the family."""
    _results(tmp_path, "s", {"a": [0.31, 0.33, 0.294, 0.335, 0.301], "b": [0.30, 0.31, 0.29, 0.32, 0.30]})
    (tmp_path / "x.json").write_text(json.dumps({"v": 2.0}))
    near = {"paper": "P", "claim": "near", "paper_figure": "2", "setting": "s", "compare": "near", "target": 2.0,
            "tolerance": 0.1, "a": {"results": "x.json", "metric": "v"}}
    claims = load_claims(_write_claims(tmp_path, [_claim(), _claim(), _claim(), near]))
    alone = assess(claims[0], tmp_path)
    assert alone["paired"]["p"] == pytest.approx(0.0452, abs=1e-3) and alone["paired"]["p"] < ALPHA
    assert alone["p_holm"] == alone["paired"]["p"] and alone["status"] == "reproduced in direction"
    got = assess_all(claims, tmp_path)
    assert [g["family_size"] for g in got] == [3] * 4 and got[3]["p_holm"] is None
    assert got[3]["status"] == "reproduced"
    for g in got[:3]:
        assert g["p_holm"] == pytest.approx(3 * g["paired"]["p"])
        assert g["status"] == "not reproduced" and g["corrected_away"]  # no isolating_run needed: Holm says why
    table = reproduction_table(tmp_path)
    assert "the 3 paired t-tests" in table and "the other 1 rows have no test" in table
    row = next(line for line in table.splitlines() if line.startswith("| `c1` |"))
    assert "Holm: tie) | 0.045 | 0.136 | not reproduced: in the claimed direction at p < 0.05 before Holm" in row
    taken = next(line for line in table.splitlines() if line.startswith("Taken away by the correction"))
    assert taken.count("Holm p 0.136") == 3 and "`c0` (p 0.045, Holm p 0.136)" in taken


def test_notes_attach_to_their_claim_by_id_not_by_text(tmp_path):
    """Three claims with the same text: each note shows under its own id, the third row has none."""
    _results(tmp_path, "s", {"a": [0.60, 0.62, 0.61, 0.63, 0.60], "b": [0.30, 0.31, 0.29, 0.32, 0.30]})
    same = [_claim(id="same-text-one"), _claim(id="same-text-two"), _claim(id="same-text-three")]
    notes = {"same-text-two": "the note for two", "same-text-one": "the note for one"}
    claims = load_claims(_write_claims(tmp_path, same, notes))
    assert [c.note for c in claims] == ["the note for one", "the note for two", ""]
    lines = reproduction_table(tmp_path).splitlines()
    rows = {line.split(" | ")[0][3:-1]: line for line in lines if line.startswith("| `same-text-")}
    assert rows["same-text-one"].endswith("(see its note) |") and rows["same-text-two"].endswith("(see its note) |")
    assert not rows["same-text-three"].endswith("(see its note) |")
    assert "- `same-text-one` (P, a beats b): the note for one" in lines
    assert "- `same-text-two` (P, a beats b): the note for two" in lines
    assert sum(line.startswith("- `") for line in lines) == 2


@pytest.mark.parametrize("claims, notes, match", [
    ([{"id": "twice"}, {"id": "twice"}], {}, "'twice' is used by an earlier claim"),
    ([{"id": "one"}], {"two": "x"}, r"names no claim with id\(s\) \['two'\]"),
    ([{"id": "one"}], {"one": ""}, "'notes' must map"),
])
def test_ids_are_unique_and_every_note_names_one(tmp_path, claims, notes, match):
    path = _write_claims(tmp_path, [_claim(**c) for c in claims], notes)
    with pytest.raises(UserInputError, match=match):
        load_claims(path)


def test_a_bare_list_of_claims_is_refused(tmp_path):
    path = _write_claims(tmp_path, [])
    path.write_text(json.dumps([_claim(id="x")]))
    with pytest.raises(UserInputError, match='"claims"'):
        load_claims(path)
