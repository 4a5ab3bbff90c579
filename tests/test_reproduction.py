"""The reproduction table: statuses follow one rule, computed from results; bad claims are refused."""

import json
from pathlib import Path

import pytest

from hf_clroute.bench.studies.reproduction import CLAIMS_FILE, assess, load_claims, reproduction_table
from hf_clroute.errors import UserInputError


def _results(root: Path, suite: str, rows: dict[str, list[float]]) -> None:
    methods = {m: {"per_seed": [{"seed": s, "A_T": v} for s, v in enumerate(vals)]} for m, vals in rows.items()}
    (root / suite).mkdir(parents=True, exist_ok=True)
    (root / suite / "results.json").write_text(json.dumps({"methods": methods}))


def _claim(**extra) -> dict:
    return {"paper": "P", "claim": "a beats b", "paper_figure": "2 vs 1", "setting": "s",
            "a": {"results": "s", "method": "a", "metric": "A_T"},
            "b": {"results": "s", "method": "b", "metric": "A_T"}, **extra}


def _write_claims(root: Path, claims: list[dict]) -> Path:
    path = root / CLAIMS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(claims))
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
    row = next(line for line in reproduction_table(tmp_path).splitlines() if line.startswith("| P |"))
    assert "(a > b on 0/4 seeds, p " in row and ": a < b) | reproduced in direction |" in row
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
             "compare": "near", "target": 2.2, "tolerance": 0.2, "a": {"results": "lm", "method": "big", "metric": "A_T"},
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
])
def test_bad_claims_name_the_field(tmp_path, bad, field):
    path = _write_claims(tmp_path, [_claim(**bad)])
    with pytest.raises(UserInputError, match=field):
        load_claims(path)


def test_pipes_in_a_claim_do_not_split_cells(tmp_path):
    _results(tmp_path, "s", {"a": [0.6] * 5, "b": [0.3] * 5})
    _write_claims(tmp_path, [_claim(claim="linear in |S|")])
    row = [line for line in reproduction_table(tmp_path).splitlines() if "linear in" in line][0]
    assert row.count(" | ") == 6


def test_the_committed_claims_render():
    root = Path(__file__).resolve().parent.parent / "results"
    table = reproduction_table(root)
    assert table.count("\n| ") - 1 == len(load_claims(root / CLAIMS_FILE))
