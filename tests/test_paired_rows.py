"""scripts/paired_rows.py: pairs any two rows of a committed table by seed, with the tables' own rule."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "scripts" / "paired_rows.py")


def paired(results: Path, *pairs: str, out: Path) -> list[dict]:
    """Run the script as README and apn_repro.sh call it; the pairs it wrote."""
    subprocess.run([sys.executable, SCRIPT, str(results), "--out", str(out), *pairs], check=True, cwd=REPO)
    return json.loads(out.read_text())["pairs"]


def refusal(results: Path, *pairs: str) -> str:
    """The error the script exits with (it must exit non-zero)."""
    done = subprocess.run([sys.executable, SCRIPT, str(results), *pairs], cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0
    return done.stderr


def test_a_pair_matches_the_verdict_the_table_records_and_an_unknown_row_is_named(tmp_path):
    (pair,) = paired(REPO / "results" / "split-mnist", "rwf:rwf-head-only", out=tmp_path / "paired.json")
    recorded = json.loads((REPO / "results" / "split-mnist" / "results.json").read_text())["methods"]["rwf"]["verdicts"]
    assert recorded["control"] == "rwf-head-only"
    for key in ("mean", "std", "wins", "p", "verdict"):
        assert pair[key] == pytest.approx(recorded["vs_control"][key])
    assert "no row 'nope'" in refusal(REPO / "results" / "split-mnist", "rwf:nope")


def test_a_metric_pair_reads_that_field_of_each_seed_as_the_lm_and_plasticity_scripts_call_it(tmp_path):
    # scripts/apn_repro.sh and qoa_plasticity.sh call `paired_rows.py DIR --out F METRIC:a/b ...`
    results = REPO / "results" / "apn-shakespeare-kjv"
    (retention,) = paired(results, "retention:apn-all/dense-all", out=tmp_path / "paired.json")
    rows = json.loads((results / "results.json").read_text())["methods"]
    for side, method in (("a_per_seed", "apn-all"), ("b_per_seed", "dense-all")):
        assert retention[side] == {str(r["seed"]): r["retention"] for r in rows[method]["per_seed"]}
    pairs = zip(rows["apn-all"]["per_seed"], rows["dense-all"]["per_seed"])
    diffs = [a["retention"] - b["retention"] for a, b in pairs]
    assert retention["metric"] == "retention" and retention["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert "no field 'A_T'" in refusal(results, "dense-all:apn-all")  # a:b is A_T, which LM rows do not have


def test_an_indexed_metric_reads_one_cell_of_a_nested_list_and_a_bad_index_is_named(tmp_path):
    # apn_repro.sh pairs PPL_A after B as ppl_matrix.1.0 (row: after training on B; column: domain A)
    results = REPO / "results" / "apn-shakespeare-kjv"
    (pair,) = paired(results, "ppl_matrix.1.0:apn-all/dense-all", out=tmp_path / "paired.json")
    rows = json.loads((results / "results.json").read_text())["methods"]
    assert pair["a_per_seed"] == {str(r["seed"]): r["ppl_matrix"][1][0] for r in rows["apn-all"]["per_seed"]}
    assert pair["a_per_seed"] != {str(r["seed"]): r["ppl_matrix"][0][1] for r in rows["apn-all"]["per_seed"]}
    assert "'ppl_matrix.2.0' does not index field 'ppl_matrix'" in refusal(results, "ppl_matrix.2.0:apn-all/dense-all")


def test_minus_pairs_two_rows_drops_seed_by_seed_and_a_row_missing_from_the_second_table_is_named(tmp_path):
    # README's task-count sentences: how much more A_T a row loses from 5 to 20 tasks than another row
    five, twenty = REPO / "results" / "wordnet-5tasks", REPO / "results" / "wordnet-20tasks"
    done = subprocess.run([sys.executable, SCRIPT, str(five), "--minus", str(twenty), "rwf:dualprompt",
                           "--out", str(tmp_path / "drop.json")], check=True, cwd=REPO)
    written = json.loads((tmp_path / "drop.json").read_text())
    (pair,) = written["pairs"]
    assert done.returncode == 0 and written["minus"] == str(twenty)
    rows = [json.loads((d / "results.json").read_text())["methods"] for d in (five, twenty)]
    for side, method in (("a_per_seed", "rwf"), ("b_per_seed", "dualprompt")):
        at = [{r["seed"]: r["A_T"] for r in table[method]["per_seed"]} for table in rows]
        assert pair[side] == pytest.approx({str(s): at[0][s] - at[1][s] for s in at[0] if s in at[1]})
    drops = [pair["a_per_seed"][s] - pair["b_per_seed"][s] for s in pair["a_per_seed"]]
    assert pair["mean"] == pytest.approx(sum(drops) / len(drops)) and pair["n"] == len(drops)
    # knn ran on wordnet but not in the task-count study: the second table is the one named
    error = subprocess.run([sys.executable, SCRIPT, str(REPO / "results" / "wordnet"), "--minus", str(twenty),
                            "knn:rwf"], cwd=REPO, capture_output=True, text=True)
    assert error.returncode != 0 and f"{twenty}: no row 'knn'" in error.stderr
