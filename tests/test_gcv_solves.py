"""scripts/gcv_solves.py: README's command that prints every RanPAC solve of a run (why GCV's lambda moves)."""

import json
import re
import runpy
import sys
from pathlib import Path

from hf_clroute.heads import ranpac

REPO = Path(__file__).resolve().parents[1]


def test_every_solve_is_printed_with_its_rule_and_the_run_still_writes_its_results(tiny_suite, tmp_path, monkeypatch,
                                                                                   capsys):
    # 10 classes in 5 tasks of 2: from the third task on, gcv_min_classes (5) classes are in and GCV takes over.
    # A 256-wide projection instead of 2048: every solve is an eigendecomposition of the M x M Gram matrix.
    # (A suite's head_options replace the variant's whole block: the rest is ranpac-gcv's own.)
    head = {"projection_dim": 256, "ridge_lambda": 1.0, "nonlinearity": "relu", "lambda_mode": "gcv"}
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"base": str(tiny_suite), "name": "tiny-mnist-10", "max_classes": 10, "n_tasks": 5,
                                 "method_settings": {"ranpac-gcv": {"config": {"head_options": head}}}}))
    out = tmp_path / "gcv"
    # The script run as `python scripts/gcv_solves.py ...`, in this process (a fresh interpreter costs seconds of
    # imports); the solve it patches in is put back afterwards.
    monkeypatch.setattr(ranpac.RandomProjectionRidgeHead, "_solve", ranpac.RandomProjectionRidgeHead._solve)
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / "gcv_solves.py"), "bench", "--suite", str(suite),
                                      "--methods", "ranpac-gcv", "--seeds", "0", "--quick", "--out", str(out),
                                      "--no-progress"])
    runpy.run_path(str(REPO / "scripts" / "gcv_solves.py"), run_name="__main__")
    stdout = capsys.readouterr().out
    solves = re.findall(r"\[solve\] examples=(\d+) classes=(\d+) rule=(\w+) lambda/mean_eigenvalue=\S+ "
                        r"rank=(\d+) M=(\d+)", stdout)
    assert solves, stdout
    assert {int(m) for *_, m in solves} == {256}  # the suite's projection reached the head
    examples = [int(s[0]) for s in solves]
    assert examples == sorted(examples) and examples[-1] == 10 * 8  # 10 classes x 8 training examples (--quick)
    # the rule the head printed is the one it must use: relative below gcv_min_classes (5) classes, then GCV
    assert [rule for _, _, rule, _, _ in solves] == ["gcv" if int(k) >= 5 else "relative" for _, k, _, _, _ in solves]
    assert {rule for _, _, rule, _, _ in solves} == {"relative", "gcv"}
    assert all(int(rank) <= min(int(n), int(m)) for n, _, _, rank, m in solves)
    assert (out / "results.json").exists()
