"""`hf-clroute report`: BENCHMARKS.md strings the committed results together."""

from __future__ import annotations

import json

from hf_clroute.bench.report import write_benchmarks


def fake_run(root, suite: str, a_t: dict[str, float], image: bool = False) -> None:
    """A results folder in the bench's shape (only the fields the report reads)."""
    folder = root / suite
    folder.mkdir(parents=True)
    methods = {m: {"A_T": {"mean": v, "std": 0.01}} for m, v in a_t.items()}
    results = {"suite": suite, "commands": [f"hf-clroute bench --suite {suite}"], "methods": methods}
    if not image:
        results["reference"] = {}  # marks a classification bench run
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "results.md").write_text(f"# {suite}\n\n| table |\n" + ("\n![curve](curve.png)\n" if image else ""))


def test_report_sets_study_variants_beside_their_base(tmp_path, monkeypatch):
    import hf_clroute.bench.plots

    monkeypatch.setattr(hf_clroute.bench.plots, "write_plots", lambda results, out: None)  # plotting is tested elsewhere
    root = tmp_path / "results"
    fake_run(root, "mnist", {"rwf": 0.5, "finetune": 0.2})
    fake_run(root, "mnist-20pct", {"rwf": 0.4, "finetune": 0.19, "ncm": 0.7})
    fake_run(root, "plasticity", {}, image=True)
    page = write_benchmarks(root, tmp_path / "BENCHMARKS.md").read_text()
    summary = page.split("## Studies")[0]
    assert "| method | mnist |" in summary and "mnist-20pct" not in summary  # variants leave the summary
    studies = page.split("## Studies")[1].split("\n## ")[0]
    assert "| rwf | 50.0 ± 1.0 | 40.0 ± 1.0 | -10.0 |" in studies
    assert "| finetune | 20.0 ± 1.0 | 19.0 ± 1.0 | -1.0 |" in studies
    assert "ncm" not in studies  # only methods run on the base and every variant
    assert "](results/plasticity/curve.png)" in page  # image links rewritten relative to the page
    assert "hf-clroute bench --suite mnist-20pct" in page


def test_a_study_sharing_no_method_with_its_base_gets_no_empty_table():
    from hf_clroute.bench.report import study_tables

    row = {"A_T": {"mean": 0.5, "std": 0.01}}
    assert study_tables({"split-mnist": {"ncm": row}, "split-mnist-buffer": {"er-b0": row}}) == ""
    table = study_tables({"split-mnist": {"ncm": row}, "split-mnist-20pct": {"ncm": row}})
    assert "| ncm | 50.0 ± 1.0 | 50.0 ± 1.0 | +0.0 |" in table


def test_the_controls_table_names_its_upper_bound_joint_else_joint_frozen():
    from hf_clroute.bench.report import controls_table

    def row(a_t: float) -> dict:
        return {"A_T": {"mean": a_t, "std": 0.01}}

    rows = {"rwf": row(0.5), "rwf-head-only": row(0.52), "slda": row(0.9), "joint-frozen": row(0.85)}
    table = controls_table({"mnist": rows})
    assert "| rwf | 50.0 ± 1.0 | rwf-head-only | 52.0 ± 1.0 | -2.0 worse (std 1.0) | slda |" in table
    assert table.rstrip().endswith("| joint-frozen 85.0 ± 1.0 |")
    table = controls_table({"mnist": rows | {"joint": row(0.95)}})
    assert table.rstrip().endswith("| joint 95.0 ± 1.0 |")
    assert controls_table({"mnist": {"rwf": row(0.5), "rwf-head-only": row(0.5)}}).rstrip().endswith("| — |")
