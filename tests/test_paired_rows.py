"""scripts/paired_rows.py: pairs any two rows of a committed table by seed, with the tables' own rule."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_a_pair_matches_the_verdict_the_table_records_and_an_unknown_row_is_named(tmp_path):
    out = tmp_path / "paired.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "paired_rows.py"), str(REPO / "results" / "split-mnist"),
                    "rwf:rwf-head-only", "--out", str(out)], check=True, cwd=REPO)
    pair = json.loads(out.read_text())["pairs"][0]
    recorded = json.loads((REPO / "results" / "split-mnist" / "results.json").read_text())["methods"]["rwf"]["verdicts"]
    assert recorded["control"] == "rwf-head-only"
    for key in ("mean", "std", "wins", "p", "verdict"):
        assert pair[key] == pytest.approx(recorded["vs_control"][key])
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "paired_rows.py"), str(REPO / "results" / "split-mnist"),
                           "rwf:nope"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0 and "no row 'nope'" in done.stderr
