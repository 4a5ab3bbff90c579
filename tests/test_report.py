"""`hf-clroute report`: BENCHMARKS.md strings the committed results together."""

from __future__ import annotations

import json

import pytest

from hf_clroute.bench.reports.report import write_benchmarks


def fake_run(root, suite: str, a_t: dict[str, float], image: bool = False) -> None:
    """A results folder in the bench's shape (only the fields the report reads)."""
    folder = root / suite
    folder.mkdir(parents=True)
    methods = {m: {"A_T": {"mean": v, "std": 0.01}} for m, v in a_t.items()}
    results = {"suite": suite, "commands": [f"hf-clroute bench --suite {suite}"], "methods": methods}
    if not image:
        results["reference"] = {}  # marks a classification bench run
    (folder / "results.json").write_text(json.dumps(results))
    curve = "\n![curve](curve.png)\n" if image else ""
    (folder / "results.md").write_text(f"# {suite}\n\n| its own table |\n" + curve)


def test_report_writes_an_index_and_the_pages_beside_the_results(tmp_path, monkeypatch):
    import hf_clroute.bench.reports.plots

    monkeypatch.setattr(hf_clroute.bench.reports.plots, "write_plots", lambda results, out: None)  # tested elsewhere
    root = tmp_path / "results"
    fake_run(root, "mnist", {"rwf": 0.5, "finetune": 0.2})
    fake_run(root, "mnist-20pct", {"rwf": 0.4, "finetune": 0.19, "ncm": 0.7})
    fake_run(root, "plasticity", {}, image=True)
    (root / "paired").mkdir()
    (root / "paired" / "mnist.json").write_text("{}")
    page = write_benchmarks(root, tmp_path / "BENCHMARKS.md").read_text()
    summary, studies, commands = ((root / name).read_text() for name in ("summary.md", "studies.md", "commands.md"))
    assert "| method | mnist |" in summary and "mnist-20pct" not in summary  # variants leave the summary
    assert "| rwf | 50.0 ± 1.0 | 40.0 ± 1.0 | -10.0 |" in studies
    assert "| finetune | 20.0 ± 1.0 | 19.0 ± 1.0 | -1.0 |" in studies
    assert "ncm" not in studies  # only methods run on the base and every variant
    assert "## mnist-20pct\n\nTable: [mnist-20pct/results.md](mnist-20pct/results.md)" in commands
    assert "```bash\nhf-clroute bench --suite mnist-20pct\n```" in commands
    # the index links every table, every page beside them and every other results file, relative to itself
    for link in ("results/mnist/results.md", "results/mnist-20pct/results.md", "results/plasticity/results.md",
                 "results/summary.md", "results/studies.md", "results/commands.md#mnist-20pct",
                 "results/paired/mnist.json"):
        assert f"]({link})" in page, link
    assert "| its own table |" not in page  # the suites' own tables stay in their results.md


def test_the_index_shows_one_headline_table_per_main_suite(tmp_path, monkeypatch):
    import hf_clroute.bench.reports.plots
    from hf_clroute.bench.reports.report import first_table

    monkeypatch.setattr(hf_clroute.bench.reports.plots, "write_plots", lambda results, out: None)
    root = tmp_path / "results"
    fake_run(root, "split-mnist", {"finetune": 0.2, "slda": 0.9, "rwf": 0.5})
    fake_run(root, "qoa-plasticity", {}, image=True)
    (root / "qoa-plasticity" / "results.md").write_text("# plasticity\n\nWhat the columns mean.\n\n| a |\n|---|\n"
                                                        "| 1 |\n\nA second table.\n\n| b |\n")
    page = write_benchmarks(root, tmp_path / "BENCHMARKS.md").read_text()
    headline = page.split("### split-mnist\n")[1].split("\n### ")[0]
    assert headline.index("| slda | 90.0 ± 1.0 |") < headline.index("| rwf |") < headline.index("| finetune |")
    assert "full table: [split-mnist/results.md](results/split-mnist/results.md)" in headline
    assert "What the columns mean.\n\n| a |\n|---|\n| 1 |" in page and "A second table" not in page
    assert first_table("# x\n\nno table here\n") == ""


def test_a_study_sharing_no_method_with_its_base_gets_no_empty_table():
    from hf_clroute.bench.reports.tables import study_tables

    row = {"A_T": {"mean": 0.5, "std": 0.01}}
    assert study_tables({"split-mnist": {"ncm": row}, "split-mnist-buffer": {"er-b0": row}}) == ""
    table = study_tables({"split-mnist": {"ncm": row}, "split-mnist-20pct": {"ncm": row}})
    assert "| ncm | 50.0 ± 1.0 | 50.0 ± 1.0 | +0.0 |" in table
    # task counts read in order: 5, 10, 40 tasks, not the order of their names' characters
    counts = study_tables({"wordnet": {"ncm": row}, **{f"wordnet-{n}tasks": {"ncm": row} for n in (40, 10, 5)}})
    assert counts.index("wordnet-5tasks") < counts.index("wordnet-10tasks") < counts.index("wordnet-40tasks")


def _row(per_seed: list[float], edge: bool | None = None, validation: float | None = None) -> dict:
    """A method's results row from its per-seed A_T (seeds 0, 1, ...), its pick's edge flag and validation A_T."""
    mean = sum(per_seed) / len(per_seed)
    std = (sum((v - mean) ** 2 for v in per_seed) / max(len(per_seed) - 1, 1)) ** 0.5
    row = {"A_T": {"mean": mean, "std": std}, "per_seed": [{"seed": i, "A_T": v} for i, v in enumerate(per_seed)]}
    if edge is not None or validation is not None:
        row["selection"] = {"edge": bool(edge)} | ({} if validation is None else {"pick_validation_A_T": validation})
    return row


def test_the_controls_table_names_its_upper_bound_joint_else_joint_frozen():
    from hf_clroute.bench.reports.tables import controls_table

    rows = {"rwf": _row([0.5] * 5), "rwf-head-only": _row([0.52] * 5), "slda": _row([0.9] * 5),
            "joint-frozen": _row([0.85] * 5)}
    table = controls_table({"mnist": rows})
    # the same difference on every seed: certain (p 0); no test size recorded: SE n/a
    assert "| rwf | 50.0 ± 0.0 | n/a | rwf-head-only | 52.0 ± 0.0 | -2.0 ± 0.0 (0 of 5, p 0): worse |" in table
    assert table.rstrip().endswith("| joint-frozen 85.0 ± 0.0 |")
    table = controls_table({"mnist": rows | {"joint": _row([0.95] * 5, edge=True)}})
    assert table.rstrip().endswith("| joint† 95.0 ± 0.0 |")  # an edge pick is marked wherever it is shown
    # the offline form (trained once, on every task) stands in where the cumulative one was not run
    assert controls_table({"mnist": rows | {"joint-offline": _row([0.93] * 5)}}).rstrip().endswith(
        "| joint-offline 93.0 ± 0.0 |")
    rows["joint-frozen"]["settings"] = {"training": {"epochs": 4}}  # the epochs validation chose
    assert controls_table({"mnist": rows}).rstrip().endswith("| joint-frozen 85.0 ± 0.0 (4 ep.) |")
    assert controls_table({"mnist": {"rwf": _row([0.5]), "rwf-head-only": _row([0.5])}}).rstrip().endswith("| — |")


def test_paired_verdicts_use_the_seeds_both_ran():
    from scipy import stats

    from hf_clroute.metrics.aggregate import paired_difference

    method = {0: 0.61, 1: 0.58, 2: 0.64, 3: 0.60, 4: 0.63, 7: 0.9}  # seed 7: the control never ran it
    control = {0: 0.57, 1: 0.56, 2: 0.60, 3: 0.59, 4: 0.58, 5: 0.1}
    paired = paired_difference(method, control)
    diffs = [method[s] - control[s] for s in range(5)]
    reference = stats.ttest_rel([method[s] for s in range(5)], [control[s] for s in range(5)])
    assert paired["seeds"] == [0, 1, 2, 3, 4] and paired["n"] == 5 and paired["wins"] == 5
    assert paired["mean"] == pytest.approx(sum(diffs) / 5)
    assert paired["t"] == pytest.approx(reference.statistic) and paired["p"] == pytest.approx(reference.pvalue)
    assert paired["p"] < 0.05 and paired["verdict"] == "better"
    assert paired_difference(control, method)["verdict"] == "worse"
    # Differences of both signs: a tie, though the means differ; fewer than 5 seeds: no verdict.
    noisy = {s: control[s] + d for s, d in zip(range(5), (0.03, -0.02, 0.04, -0.03, 0.01), strict=True)}
    assert paired_difference(noisy, control)["verdict"] == "tie"
    three = paired_difference({s: method[s] for s in range(3)}, control)
    assert three["verdict"] == "too few seeds" and three["n"] == 3 and three["p"] < 0.05
    assert paired_difference({9: 0.5}, control) is None
    # The exact t distribution for every degree of freedom a seed count gives.
    from hf_clroute.metrics.aggregate import binomial_se, t_two_sided_p

    for df in range(1, 12):
        for t in (0.0, 0.7, 2.2, -5.0):
            assert t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(abs(t), df), abs=1e-12)
    assert binomial_se(0.5, 400) == pytest.approx(0.025)


def test_results_markdown_shows_se_edge_marks_and_paired_verdicts():
    from hf_clroute.bench.runners.classification import results_markdown, with_verdicts

    def method(per_seed: list[float], edge: bool | None = None, validation: float | None = None) -> dict:
        stat = {"mean": 0.5, "std": 0.0}
        return {**_row(per_seed, edge, validation), "features_cached": False, "trainable_pct": 1.0, "peak_mem_mb": 1.0,
                "train_samples_per_s": stat, "infer_samples_per_s": stat}

    results = {"suite": "mnist", "seeds": [0, 1, 2, 3, 4], "test_size": 2000, "methods": {
        "rwf": method([0.50, 0.51, 0.49, 0.50, 0.52], edge=True),
        "rwf-head-only": method([0.55, 0.54, 0.56, 0.53, 0.55], edge=False),
        "slda": method([0.60, 0.61, 0.59, 0.60, 0.62], validation=0.7)}}
    with_verdicts(results)
    verdicts = results["methods"]["rwf"]["verdicts"]
    assert verdicts["control"] == "rwf-head-only" and verdicts["vs_control"]["verdict"] == "worse"
    assert verdicts["statistics_head"] == "slda" and verdicts["vs_statistics_head"]["wins"] == 0
    assert results["methods"]["slda"]["verdicts"]["statistics_head"] is None  # not set against itself
    table = results_markdown(results)
    assert "| rwf† | 50.4 ± 1.1 | 1.1 |" in table  # SE = sqrt(.504 * .496 / 2000)
    assert "| rwf-head-only | 54.6 ± 1.1 | 1.1 |" in table  # edge false: no mark
    assert "| rwf | rwf-head-only | -4.2 ± 1.8 (0 of 5, p 0.0" in table and "): worse | slda | -10.0 ± 0.0" in table
    assert "seeds)" not in table.split("Paired verdicts")[0].split("| method | A_T")[1]  # every row ran 5 of 5
    # A row that ran on 3 of the table's 5 seeds says so.
    results["methods"]["rwf"] = method([0.50, 0.51, 0.49], edge=False)
    assert "| rwf (3 of 5 seeds) | 50.0 ± 1.0 |" in results_markdown(results)
    # A results.json written before these fields existed: n/a, no crash.
    old = {"suite": "mnist", "seeds": [0], "methods": {"rwf": method([0.5]), "rwf-head-only": method([0.55])}}
    table = results_markdown(old)
    assert "| rwf | 50.0 | n/a |" in table and "| -5.0 (one seed, no test) |" in table
    assert "Accuracies in %, one seed: each figure is that seed's value" in table  # said once, in the caption
    assert "(one seed)" not in table.split("Paired verdicts")[0]
    assert "± 0.0" not in table.split("Paired verdicts")[0]  # one seed has no spread to show


def test_edge_marks_judge_a_recorded_search_by_the_current_rule():
    from hf_clroute.bench.reports.tables import edge_mark

    lr, k = "training.learning_rate", "config.k"
    grid = [{lr: r, k: v} for r in (3e-4, 1e-3, 3e-3) for v in (1, 2, 4)]
    moved = {lr: 9e-3, k: 2}  # an extension took the pick off the grid; k's neighbours never ran at 9e-3
    record = {"grid": grid, "extensions": [{"point": moved, "axis": lr, "side": "high"},
                                           {"point": {lr: 2.7e-2, k: 2}, "axis": lr, "side": "high"}],
              "pick_point": moved, "edge": False}  # the flag an earlier rule recorded
    assert edge_mark({"selection": record}) == "†"
    checked = [{"point": {lr: 9e-3, k: v}, "axis": k, "side": s, "check": True} for v, s in ((1, "low"), (4, "high"))]
    assert edge_mark({"selection": {**record, "extensions": record["extensions"] + checked}}) == ""
    # A row that recorded only its flag keeps it.
    assert edge_mark({"selection": {"pick": {}, "edge": True}}) == "†"
    assert edge_mark({"selection": {"edge": False}}) == ""


def test_the_best_statistics_head_is_chosen_on_validation_never_on_test():
    from hf_clroute.bench.harness.verdicts import best_statistics_head, comparisons

    rows = {"slda": _row([0.90] * 5, validation=0.80), "ranpac": _row([0.95] * 5, validation=0.78),
            "rwf": _row([0.5] * 5)}
    assert best_statistics_head(rows) == "slda"  # the better on test loses on validation
    assert comparisons(rows)["rwf"]["statistics_head"] == "slda"
    del rows["slda"]["selection"]  # a head without a validation score: n/a, never a fall-back to test
    assert best_statistics_head(rows) is None and comparisons(rows)["rwf"]["vs_statistics_head"] is None


def test_every_seed_of_a_method_ran_with_one_pick_or_the_table_is_refused(tmp_path):
    from hf_clroute.bench.harness.results import check_picks, pick_record, write_run
    from hf_clroute.errors import UserInputError

    tuned = {"pick": {"training.learning_rate": 1e-3}, "seed": 0, "pick_validation_A_T": 0.8, "edge": False}
    record = pick_record(tuned)
    assert record["pick"] == tuned["pick"] and "validation split of seed 0" in record["chosen_on"]
    assert pick_record(None)["pick"] is None
    rows = [{"seed": s, "A_T": 0.5, "selection": record} for s in (0, 1)]
    check_picks({"methods": {"er": {"per_seed": rows}}})  # one pick: fine
    other = pick_record({**tuned, "pick": {"training.learning_rate": 3e-3}})
    results = {"kind": "classification", "suite": "mnist",
               "methods": {"er": {"per_seed": rows + [{"seed": 2, "A_T": 0.6, "selection": other}]}}}
    with pytest.raises(UserInputError, match=r"'er' of 'mnist'.*different picks.*seeds \[0, 1\].*seeds \[2\]"):
        write_run(tmp_path, results, "")
    assert not (tmp_path / "results.json").exists()
    results["methods"]["er"]["per_seed"][2] = {"seed": 2, "A_T": 0.6}  # a seed that recorded no pick: unknown
    with pytest.raises(UserInputError, match="not recorded"):
        check_picks(results)
    check_picks({"methods": {"er": {"per_seed": [{"seed": 0}, {"seed": 1}]}}})  # written before picks were recorded


def test_seeds_run_at_different_precisions_are_joined_but_marked_everywhere():
    from hf_clroute.bench.harness.results import mixed_precisions, precision_groups, seed_precision
    from hf_clroute.bench.reports.tables import controls_table, study_tables, summary_table
    from hf_clroute.bench.runners.classification import results_markdown

    def precision(**dtypes: str) -> dict:
        return {phase: {"dtype": dtype, "phase": phase, "setting": "auto"} for phase, dtype in dtypes.items()}

    assert seed_precision({"seed": 0}) == "fp32"  # ran before the setting existed
    assert seed_precision({"precision": precision(train="bf16", eval="bf16")}) == "bf16"
    assert seed_precision({"precision": precision(train="fp32", eval="bf16")}) == "eval bf16, train fp32"
    mixed = _row([0.50, 0.51, 0.49, 0.50, 0.52])
    for seed_row in mixed["per_seed"]:
        seed_row["precision"] = precision(train="bf16" if seed_row["seed"] < 3 else "fp32")
    assert precision_groups(mixed) == {"bf16": [0, 1, 2], "fp32": [3, 4]}
    one = _row([0.55, 0.54, 0.56, 0.53, 0.55])  # no record on any seed: one group (fp32), no mark
    assert precision_groups(one) == {"fp32": [0, 1, 2, 3, 4]}
    assert mixed_precisions({"methods": {"rwf": mixed, "rwf-head-only": one}}) == {"rwf": precision_groups(mixed)}

    stat = {"mean": 0.5, "std": 0.0}
    shown = {m: {**r, "features_cached": False, "trainable_pct": 1.0, "peak_mem_mb": 1.0, "train_samples_per_s": stat,
                 "infer_samples_per_s": stat} for m, r in {"rwf": mixed, "rwf-head-only": one}.items()}
    table = results_markdown({"suite": "wordnet-5tasks", "seeds": [0, 1, 2, 3, 4], "methods": shown})
    assert "| rwf‡ | 50.4 ± 1.1 |" in table and "| rwf-head-only | 54.6" in table and "‡ : its seeds ran" in table
    assert "‡" not in results_markdown({"suite": "wordnet-5tasks", "seeds": [0, 1, 2, 3, 4],
                                        "methods": {"rwf-head-only": shown["rwf-head-only"]}})  # no note without a mark
    studies = study_tables({"wordnet": {"rwf": one}, "wordnet-5tasks": {"rwf": mixed}})
    assert "| rwf | 54.6 ± 1.1 | 50.4 ± 1.1‡ | -4.2 |" in studies and "‡ : its seeds ran" in studies
    summary = summary_table({"wordnet": {"rwf": mixed, "rwf-head-only": one}})
    assert "| rwf | 50.4 ± 1.1‡ |" in summary and "‡ : its seeds ran" in summary
    assert "| rwf‡ |" in controls_table({"wordnet": {"rwf": mixed, "rwf-head-only": one}})


def test_report_reproduces_the_committed_pages_byte_for_byte(tmp_path, monkeypatch):
    """`hf-clroute report` over the committed results writes the committed results.md tables, BENCHMARKS.md
    (an index of at most 400 lines) and the pages beside the results, byte for byte."""
    import shutil
    from pathlib import Path

    import hf_clroute.bench.reports.plots
    from hf_clroute.bench.runners.dispatch import rewrite_markdown

    monkeypatch.setattr(hf_clroute.bench.reports.plots, "write_plots", lambda results, out: None)  # copied below
    repo = Path(__file__).resolve().parents[1]
    committed = repo / "results"
    shutil.copytree(committed, tmp_path / "results")
    rewrite_markdown(tmp_path / "results")  # what `hf-clroute report` does first: the committed tables are its output
    for results_md in (tmp_path / "results").glob("*/results.md"):
        assert results_md.read_text() == (committed / results_md.parent.name / "results.md").read_text(), results_md
    page = write_benchmarks(tmp_path / "results", tmp_path / "BENCHMARKS.md").read_text()
    assert page == (repo / "BENCHMARKS.md").read_text(), "run `hf-clroute report` and commit what it writes"
    for name in ("summary.md", "studies.md", "commands.md"):
        assert (tmp_path / "results" / name).read_text() == (committed / name).read_text(), name
    assert len(page.splitlines()) <= 400
    assert "### split-mnist\n" in page and "method − control" in (committed / "summary.md").read_text()


def test_each_committed_selection_json_keeps_the_picks_its_tables_rows_ran_with():
    """selection.json beside a table is what its rows trained with (``merge_selections``), never an older search's."""
    import json
    from pathlib import Path

    committed = Path(__file__).resolve().parents[1] / "results"
    for selection_file in committed.glob("*/selection.json"):
        results_file = selection_file.parent / "results.json"
        if not results_file.is_file():
            continue
        entries = json.loads(selection_file.read_text())["methods"]
        for method, row in json.loads(results_file.read_text()).get("methods", {}).items():
            ran_with = (row.get("selection") or {}).get("pick")
            if ran_with is not None and method in entries:
                assert entries[method]["pick"] == ran_with, (selection_file, method)


def test_the_adaptation_table_pairs_each_adapted_row_with_the_same_head_frozen(monkeypatch):
    from hf_clroute.bench.harness import verdicts
    from hf_clroute.bench.reports import tables as report

    monkeypatch.setattr(verdicts, "method_file",
                        lambda m: {"control": "ranpac-gcv"} if m.endswith("-fsa-ranpac") else {})
    for module in (report, verdicts):
        monkeypatch.setattr(module, "registered_method", lambda m: m.split("-")[0])

    def adapted(per_seed, validation, **config):
        return _row(per_seed, validation=validation) | {
            "settings": {"adapter_config": {"head": "ranpac", "adaptation": {"on": "first_task"}, **config}}}

    rows = {"ranpac": _row([0.90, 0.91, 0.92, 0.90, 0.91], validation=0.9),
            "ranpac-gcv": _row([0.90, 0.91, 0.92, 0.90, 0.91], validation=0.89),
            "rwf-fsa-ranpac": adapted([0.92, 0.93, 0.94, 0.92, 0.93], validation=0.91),
            "lastblock-fsa-ranpac": adapted([0.89, 0.91, 0.91, 0.90, 0.90], validation=0.92, last_blocks=1)}
    table = report.adaptation_table({"fsa-mnist": rows, "mnist": {"ranpac": rows["ranpac"]}})
    assert "| fsa-mnist | rwf | ranpac | rwf-fsa-ranpac | 92.8 ± 0.8 | +2.0 ± 0.0 (5 of 5, p 0): better |" in table
    assert "| fsa-mnist | last 1 block | ranpac | lastblock-fsa-ranpac |" in table
    # The best adapted row is the best on validation (lastblock), not on test (rwf); it ties the head.
    assert "by the paired test on 0 of 1 tables (fsa-mnist: lastblock-fsa-ranpac -0.6" in table
    rows["lastblock-fsa-ranpac"]["selection"]["pick_validation_A_T"] = 0.5
    assert "on 1 of 1 tables (fsa-mnist: rwf-fsa-ranpac +2.0" in report.adaptation_table({"fsa-mnist": rows})
    rows["rwf-fsa-ranpac"] = adapted([0.91, 0.93, 0.92, 0.90, 0.92], validation=0.91)  # +0.6 ± 0.5 > std: a tie
    assert "on 0 of 1 tables" in report.adaptation_table({"fsa-mnist": rows})
    del rows["rwf-fsa-ranpac"]["selection"]
    assert "fsa-mnist: n/a (an adapted row has no validation score)" in report.adaptation_table({"fsa-mnist": rows})
    assert report.adaptation_table({"mnist": {"ranpac": rows["ranpac"]}}) == ""


def test_the_headroom_table_names_adapters_the_paired_test_calls_better_on_the_strongest_frozen_readout():
    from hf_clroute.bench.reports.tables import headroom_table

    def study(seeds, gains, validation=(0.6, 0.8, 0.7)):
        """Frozen test accuracies slda 0.9, ranpac 0.8, probe 0.7 (slda best on test); ``validation``: theirs
        on validation; ``gains``: adapter -> per-readout per-seed gains."""
        frozen_test = {"slda": 0.9, "ranpac": 0.8, "probe": 0.7}
        frozen = [{"seed": s, **{r: {"test": frozen_test[r], "validation": v} for r, v in zip(frozen_test, validation)}}
                  for s in seeds]
        methods = {a: {"per_seed": [{"seed": s, "readouts": {
            r: {"frozen": frozen_test[r], "adapted": frozen_test[r] + g[r][i], "edge": r == "probe" and a == "lora"}
            for r in frozen_test}} for i, s in enumerate(seeds)]} for a, g in gains.items()}
        return {"seeds": list(seeds), "frozen": frozen, "methods": methods}

    steady = {"slda": [0.05] * 5, "ranpac": [0.010, 0.012, 0.009, 0.011, 0.010], "probe": [0.0] * 5}
    noisy = {"slda": [0.05] * 5, "ranpac": [0.02, -0.01, 0.01, -0.005, 0.002], "probe": [0.0] * 5}
    table = headroom_table({"headroom-mnist": study(range(5), {"lora": steady, "rwf": noisy})})
    # ranpac is the strongest frozen readout on validation (slda is on test); only lora's gain is significant there
    assert "headroom-mnist: ranpac (80.0 frozen), lora +1.0 ± 0.1 (5 of 5, p 3.4e-05): better." in table
    assert ("| headroom-mnist | 5 | rwf | +5.0 ± 0.0 (5 of 5, p 0): better | +0.3 ± 1.2 (3 of 5, p 0.56): tie * |"
            in table)
    assert "| +0.0 ± 0.0 (0 of 5, p 1): tie† |" in table  # lora's probe pick sits on an edge
    three = headroom_table({"headroom-mnist": study(range(3), {"lora": {r: v[:3] for r, v in steady.items()}})})
    assert "headroom-mnist: ranpac (80.0 frozen), none." in three and "too few seeds" in three  # 3 seeds: no verdict
    one = headroom_table({"headroom-mnist": study([0], {"lora": {r: v[:1] for r, v in steady.items()}})})
    assert "+1.0 (one seed, no test)" in one and "± 0.0" not in one
    mixed = study(range(3), {"lora": {r: v[:3] for r, v in steady.items()}})
    mixed["methods"]["rwf"] = {"per_seed": mixed["methods"]["lora"]["per_seed"][:1]}  # one seed of rwf beside 3
    assert "| headroom-mnist | 1 | rwf | +5.0 (one seed, no test) |" in headroom_table({"headroom-mnist": mixed})
    unscored = study(range(5), {"lora": steady})
    del unscored["frozen"][0]["probe"]["validation"]  # written before the probe chose its L2 on validation
    assert "headroom-mnist: n/a (a frozen readout has no validation score" in headroom_table(
        {"headroom-mnist": unscored})
    listed = {**study(range(5), {"lora": steady}), "config": {"adapters": ["rwf", "lora"]}}
    assert "| headroom-mnist | 0 | rwf | not run | not run | not run |" in headroom_table({"headroom-mnist": listed})
    assert headroom_table({}) == ""


def test_a_row_searched_before_the_one_rule_carries_its_mark():
    from hf_clroute.bench.reports.tables import marks

    grid = [{"training.learning_rate": r} for r in (3e-4, 1e-3, 3e-3)]
    earlier = {"grid": grid, "pick_point": grid[1], "pick": grid[1], "extensions": [], "edge": False}
    assert marks({"selection": earlier}) == "§"
    ruled = {**earlier, "search_rule": {"max_extensions": 18, "se_multiple": 1.0}}
    assert marks({"selection": ruled}) == ""
    assert marks({"selection": {}}) == "" and marks(None) == ""  # nothing searched: nothing to mark
