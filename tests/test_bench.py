"""`hf-clroute bench` end to end on a tiny real suite: results.json shape, markdown, caching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_clroute.bench.harness.suites import SuiteConfig, builtin_suites
from hf_clroute.cli import main

METHOD_KEYS = {
    "A_T", "F_T", "A_bar", "BWT", "FWT", "A_AUC", "trainable_params", "trainable_pct",
    "train_samples_per_s", "infer_samples_per_s", "peak_mem_mb", "accuracy_matrix",
}


def test_bench_writes_results_in_the_shared_shape(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bench", "--suite", str(tiny_suite), "--seeds", "0,1", "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["suite"] == "tiny-mnist" and results["seeds"] == [0, 1]
    assert set(results["methods"]) == {"finetune", "ncm"}
    for name, row in results["methods"].items():
        assert METHOD_KEYS <= set(row), name
        assert set(row["A_T"]) == {"mean", "std"}
        assert len(row["accuracy_matrix"]) == 2 and len(row["per_seed"]) == 2
    assert results["methods"]["ncm"]["features_cached"] and not results["methods"]["finetune"]["features_cached"]
    assert results["methods"]["ncm"]["trainable_params"] == 0
    assert results["reference"]["bare_backbone"]["train_samples_per_s"]["mean"] > 0
    table = (out / "results.md").read_text()
    assert "| finetune |" in table and "| ncm* |" in table and "bare backbone" in table
    assert "tiny-mnist" in capsys.readouterr().out


def test_cached_features_give_the_same_ncm_result_as_raw_inputs(tiny_suite, tmp_path):
    from hf_clroute.bench.harness.feature_cache import FeatureCollator, cache_stream_features
    from hf_clroute.bench.harness.suites import build_stream, load_suite_backbone
    from hf_clroute.bench.runners.classification import run_method

    suite = SuiteConfig.load(str(tiny_suite))
    stream = build_stream(suite, seed=0)
    raw, _, _ = run_method(suite, "ncm", 0, stream=stream, progress=False)
    backbone, collator = load_suite_backbone(suite)
    cached_stream, _ = cache_stream_features(backbone, stream, collator)
    cached, _, _ = run_method(suite, "ncm", 0, stream=cached_stream, collator=FeatureCollator(), progress=False)
    assert sum(cached.accuracy_matrix, []) == pytest.approx(sum(raw.accuracy_matrix, []), abs=1e-6)


def test_builtin_suites_load_and_bad_suites_are_named(tmp_path):
    assert {"split-mnist", "split-fashion", "wordnet"} <= set(builtin_suites())
    for name in ("split-mnist", "split-fashion", "wordnet"):
        suite = SuiteConfig.load(name)
        assert suite.quick_version().train_per_class < suite.train_per_class
    with pytest.raises(ValueError, match="unknown suite"):
        SuiteConfig.load("no-such-suite")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "dataset": "mnist", "backbone": "b", "n_taks": 3}))
    with pytest.raises(ValueError, match="n_taks"):
        SuiteConfig.load(str(bad))
    assert main(["bench", "--suite", str(bad), "--out", str(tmp_path / "o")]) == 2


def test_a_suite_file_can_extend_another(tmp_path):
    base, scarce = SuiteConfig.load("split-mnist"), SuiteConfig.load("split-mnist-20pct")
    assert (scarce.dataset, scarce.backbone, scarce.n_tasks) == (base.dataset, base.backbone, base.n_tasks)
    assert scarce.train_per_class * 5 == base.train_per_class and scarce.name == "split-mnist-20pct"
    # training/quick merge key by key: the 5-task study switches anytime evaluation off, nothing else
    five = SuiteConfig.load("wordnet-5tasks")
    assert five.training == {**SuiteConfig.load("wordnet").training, "eval_every": 0, "evals_per_task": 0}
    assert scarce.training == base.training and scarce.bases == ["split-mnist"]
    assert scarce.quick_version().training["batch_size"] == base.training["batch_size"]
    assert [SuiteConfig.load(f"wordnet-{n}tasks").n_tasks for n in (5, 10, 20, 40)] == [5, 10, 20, 40]
    loop = tmp_path / "loop.json"
    loop.write_text(json.dumps({"base": str(loop), "name": "loop"}))
    with pytest.raises(ValueError, match="loops back"):
        SuiteConfig.load(str(loop))


def test_methods_command_lists_methods_and_variants(capsys):
    assert main(["methods", "--all"]) == 0
    out = capsys.readouterr().out
    assert "rwf" in out and "Routing without Forgetting" in out and "ncm" in out
    assert "lora-ctl" in out and " lora " in out and "mars-no-sgse" in out


def test_a_method_variant_changes_only_what_it_lists():
    from hf_clroute.bench.harness.settings import resolve_run

    suite = SuiteConfig.load("split-mnist")
    lora, variant = resolve_run(suite, "lora", 0), resolve_run(suite, "lora-ctl", 0)
    assert variant.registered_method == "lora" and variant.training == lora.training
    assert variant.adapter_config.to_dict() == {**lora.adapter_config.to_dict(), "current_task_loss": True}
    assert variant.sources["config.current_task_loss"] == "configs/ablations/lora-ctl.json"


def test_merge_joins_seeds_run_as_separate_invocations(tiny_suite, tmp_path):
    out = tmp_path / "merged"
    base = ["bench", "--suite", str(tiny_suite), "--methods", "ncm", "--out", str(out), "--no-progress", "--merge"]
    assert main([*base, "--seeds", "0"]) == 0
    assert main([*base, "--seeds", "1"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert merged["seeds"] == [0, 1] and len(merged["commands"]) == 2
    rows = merged["methods"]["ncm"]["per_seed"]
    assert [r["seed"] for r in rows] == [0, 1]
    expected = sum(r["A_T"] for r in rows) / 2
    assert merged["methods"]["ncm"]["A_T"]["mean"] == pytest.approx(expected)
    # A method can be dropped (a retired variant): its rows and plots go, the command is recorded.
    assert main([*base[:4], "finetune", *base[5:], "--seeds", "0"]) == 0
    assert (out / "plots" / "accuracy_matrix_finetune.png").is_file()
    assert main(["merge", str(out), "--out", str(out), "--drop", "finetune"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert set(merged["methods"]) == {"ncm"} and merged["commands"][-1].endswith("--drop finetune")
    assert not (out / "plots" / "accuracy_matrix_finetune.png").exists()
    assert main(["merge", str(out), "--out", str(out), "--drop", "nope"]) == 2


@pytest.mark.slow
def test_the_wheel_ships_the_builtin_suites_and_the_card_template(tmp_path):
    """`pip install hf_clroute` (not a checkout) must still find every suite, method setting and the card template."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    from hf_clroute.bench.harness.settings import CONFIG_ROOT
    from hf_clroute.bench.reports.cards import TEMPLATE

    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(repo), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True)
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    package = Path(__import__("hf_clroute").__file__).resolve().parent
    shipped = sorted(CONFIG_ROOT.glob("*/*.json")) + [TEMPLATE]
    assert len(shipped) > 20
    relative = [p.relative_to(package) for p in shipped]
    missing = [str(r) for r in relative if f"hf_clroute/{r.as_posix()}" not in names]
    assert not missing, f"not in the wheel: {missing}"


def test_tune_picks_on_validation_and_bench_trains_with_the_pick(tiny_suite, tmp_path, monkeypatch):
    from hf_clroute.bench.runners import tune as tuning
    from hf_clroute.bench.runners.classification import run as run_classification

    data = json.loads(Path(tiny_suite).read_text())
    data["validation_per_class"] = 4
    path = tmp_path / "tiny-val.json"
    path.write_text(json.dumps(data))
    suite = SuiteConfig.load(str(path))
    # keep the test small (2 learning rates, one weight decay, one extension); the rule is tested in test_tune.py
    monkeypatch.setattr(tuning, "LEARNING_RATES", (1e-4, 1e-2))
    monkeypatch.setattr(tuning, "BUDGET", 2)
    monkeypatch.setattr(tuning, "WEIGHT_DECAYS", (0.0,))
    monkeypatch.setattr(tuning, "MAX_EXTENSIONS", 1)
    selection = tuning.tune(suite, ["finetune", "ncm"], tmp_path / "tuned")
    record = selection["methods"]["finetune"]
    assert [p["training.learning_rate"] for p in record["grid"]] == [1e-4, 1e-2]
    # With two rates the pick is on an edge: one extension ran, a step past it, unless the rate is inert (both
    # rates score the same: the pick stays at the grid's centre, the first rate, and nothing extends).
    extensions = record["extensions"]
    assert len(extensions) == (0 if record["inert_axes"] else 1)
    assert all(e["point"]["training.learning_rate"] in (1e-6, 1.0) and e["axis"] == "training.learning_rate"
               for e in extensions)
    assert record["pick"] == record["pick_point"] in [*record["grid"], *(e["point"] for e in extensions)]
    assert record["search_rule"]["n_validation"] == 16 and record["search_rule"]["max_extensions"] == 1
    assert selection["methods"]["ncm"]["grid"] == [{}]  # nothing to train: no learning rate to search
    results = run_classification(str(path), methods=["finetune"], seeds=[0], quick=False, out=tmp_path / "run",
                                 progress=False, selection=tmp_path / "tuned" / "selection.json")
    row = results["methods"]["finetune"]
    assert row["selection"] == record
    # each seed's row records the pick it ran with and where it was chosen (a merge compares them)
    assert row["per_seed"][0]["selection"]["pick"] == record["pick"]
    assert "validation" in row["per_seed"][0]["selection"]["chosen_on"]
    assert row["settings"]["training"]["learning_rate"] == record["pick"]["training.learning_rate"]
    assert row["settings"]["sources"]["training.learning_rate"] == "selection (validation)"
    assert row["FWT"] is None  # class-incremental: undefined, not a number
    # the run keeps the picks it trained with (only its own methods' picks), so a merge carries them
    kept = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert kept["methods"] == {"finetune": record} and kept["suite"] == selection["suite"]


def test_search_budget_is_the_same_for_every_method():
    from hf_clroute.bench.runners.tune import BUDGET, search_grid

    assert len(search_grid("rwf", trains=True)) == BUDGET
    assert len(search_grid("finetune", trains=True)) == BUDGET  # no knob of its own: weight decay
    assert search_grid("ncm", trains=False) == [{}]


def test_merge_reads_a_suite_field_missing_from_an_older_run_as_its_default():
    from hf_clroute.bench.harness.suites import SuiteConfig, same_suite_config

    old = {"name": "split-mnist", "n_tasks": 5, "methods": ["ncm"]}  # recorded before image_size/test_split existed
    assert same_suite_config(old, {**old, "image_size": None, "test_split": "test"}, SuiteConfig)
    assert not same_suite_config(old, {**old, "image_size": 224}, SuiteConfig)
    assert not same_suite_config(old, {**old, "n_tasks": 10}, SuiteConfig)
    # another default method list or description measures the same thing
    assert same_suite_config(old, {**old, "methods": ["ncm", "qoa"], "description": "new words"}, SuiteConfig)
    # a suite's default learning rate is overridden per method (its file or its pick; each row records its own),
    # every other training value is part of the measurement
    trained = {**old, "training": {"batch_size": 10, "learning_rate": 0.001}}
    assert same_suite_config(trained, {**old, "training": {"batch_size": 10}}, SuiteConfig)
    assert not same_suite_config(trained, {**old, "training": {"batch_size": 20, "learning_rate": 0.001}}, SuiteConfig)
    # runs of different APN variants join; one variant recorded with two settings does not
    one, other = {**old, "apn_variants": {"apn-a": {"tau": 0.07}}}, {**old, "apn_variants": {"apn-b": {"tau": 0.1}}}
    assert same_suite_config(one, other) and same_suite_config(one, old)
    assert not same_suite_config(one, {**old, "apn_variants": {"apn-a": {"tau": 0.5}}})


def test_runs_join_a_suite_files_per_method_settings_only_where_their_methods_agree():
    from hf_clroute.bench.harness.suites import check_mergeable, joined_config

    config = {"name": "wordnet-20tasks", "n_tasks": 20}
    rows = {"suite": "wordnet-20tasks", "config": config, "methods": {"rwf": {}}}  # recorded before the entry
    pool = {"config": {"e_pool_size": 20}}
    dualprompt = {"suite": "wordnet-20tasks", "config": {**config, "method_settings": {"dualprompt": pool}},
                  "methods": {"dualprompt": {}}}
    check_mergeable([rows, dualprompt])  # RwF's rows did not use DualPrompt's entry
    assert joined_config([rows, dualprompt])["method_settings"] == {"dualprompt": pool}
    without = {**dualprompt, "config": config}  # the same method run without the entry: another measurement
    for runs in ([without, dualprompt], [dualprompt, rows, without]):
        with pytest.raises(ValueError, match="different suites or suite configs"):
            check_mergeable(runs)
    other = {**dualprompt, "config": {**config, "method_settings": {"dualprompt": {"config": {"e_pool_size": 40}}}}}
    with pytest.raises(ValueError, match="suite configs"):
        check_mergeable([dualprompt, other])


def test_merging_runs_joins_their_selections(tmp_path):
    import json

    from hf_clroute.bench.runners.classification import merge_selections

    for name, methods in (("a", {"rwf": {"pick": {"training.learning_rate": 1e-3}}, "old": {"pick": {}}}),
                          ("b", {"qoa": {"pick": {"training.learning_rate": 3e-3}}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "selection.json").write_text(json.dumps(
            {"suite": "split-mnist", "methods": methods, "commands": [f"hf-clroute tune ... {name}"]}))
    merge_selections([tmp_path / "a", tmp_path / "b"], tmp_path / "a", drop=("old",))
    merged = json.loads((tmp_path / "a" / "selection.json").read_text())
    assert merged["suite"] == "split-mnist" and set(merged["methods"]) == {"rwf", "qoa"}
    assert merged["commands"] == ["hf-clroute tune ... a", "hf-clroute tune ... b"]
    # rows taken from a folder without a selection.json: the record they ran with replaces the file's
    # older entry, and a row that recorded no pick leaves the file's entry alone
    ran_with = {"pick": {"training.learning_rate": 9e-3}, "grid": [], "edge": False}
    merge_selections([tmp_path / "a", tmp_path / "b"], tmp_path / "c", drop=("old",),
                     rows={"rwf": {"selection": ran_with}, "qoa": {"selection": None}})
    merged = json.loads((tmp_path / "c" / "selection.json").read_text())
    assert merged["methods"] == {"rwf": ran_with, "qoa": {"pick": {"training.learning_rate": 3e-3}}}
