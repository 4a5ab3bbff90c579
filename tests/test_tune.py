"""`hf-clroute tune`'s search rule: one budget for every method, edge picks extend their axis.

The rule is tested on synthetic validation scores (a function of the point), so no training runs;
tests/test_bench.py runs the tuner end to end on a tiny suite.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hf_clroute.bench.harness.grid_search import recorded_flags, search, step_past
from hf_clroute.bench.harness.settings import CONFIG_ROOT, SETTINGS_FOLDERS, registered_method
from hf_clroute.bench.runners import tune as tuning
from hf_clroute.bench.runners.tune import BUDGET, LEARNING_RATES, search_grid, selected

LR = "training.learning_rate"
#: methods that train nothing: their grid is their own 12 points (or one point when they have no knob)
CLOSED_FORM = {"simplecil", "ncm", "slda", "ranpac", "knn"}


def _always_valid(point):
    return True


def _score_peaked_at(**peaks: float):
    """Validation A_T that falls with each axis's log-distance from its peak (other keys ignored)."""
    def score(point):
        return 1.0 - sum(abs(math.log10(point[k] / v)) for k, v in peaks.items()) / 100
    return score


def test_every_method_file_gets_exactly_the_budget():
    wrong = []
    for path in sorted(p for folder in SETTINGS_FOLDERS for p in (CONFIG_ROOT / folder).glob("*.json")):
        trains = registered_method(path.stem) not in CLOSED_FORM
        try:
            grid = search_grid(path.stem, trains)
        except ValueError as error:
            wrong.append(str(error))
            continue
        assert len(grid) == BUDGET or grid == [{}], path.stem
        if trains:  # every trained method: the same learning rates, each with its 4 own points
            assert sorted({p[LR] for p in grid}) == sorted(LEARNING_RATES), path.stem
    assert not wrong, "\n".join(wrong)


def test_a_method_without_knobs_searches_weight_decay_and_explicit_points_are_read(monkeypatch):
    assert {p["training.weight_decay"] for p in search_grid("finetune", trains=True)} == set(tuning.WEIGHT_DECAYS)
    files = {
        "pts": {"search": {"points": [{"config.a": a, "config.b": b}
                                      for a, b in ((1, "x"), (2, "x"), (1, "y"), (4, "y"))]}},
        "nested": {"search": {"config.head_options": [{"ridge_lambda": 0.1, "dim": 8}, {"ridge_lambda": 1.0, "dim": 8}],
                              "config.k": [1, 2]}},
        "small": {"search": {"config.k": [1, 2, 3]}},
        "wide": {"search": {"config.a": [1, 2], "config.b": [1, 2], "config.c": [1]}},
        "three": {"search": {"points": [{"config.a": i, "config.b": i, "config.c": i} for i in range(4)]}},
        "both": {"search": {"points": [], "config.a": [1]}},
        "variant": {"method": "pts", "search": {"config.z": [1, 2, 3, 4]}},  # its own search replaces its method's
    }
    monkeypatch.setattr("hf_clroute.bench.harness.settings.method_file", lambda m: files.get(m, {}))
    grid = search_grid("pts", trains=True)
    assert len(grid) == BUDGET and grid[1] == {LR: LEARNING_RATES[0], "config.a": 2, "config.b": "x"}
    grid = search_grid("nested", trains=True)  # dict values become dotted keys; the constant is no knob
    assert grid[0] == {LR: LEARNING_RATES[0], "config.head_options.ridge_lambda": 0.1, "config.head_options.dim": 8,
                       "config.k": 1}
    assert {p.get("config.z") for p in search_grid("variant", trains=True)} == {1, 2, 3, 4}
    with pytest.raises(ValueError, match=r"method 'small': 9 configurations .* exactly 12"):
        search_grid("small", trains=True)
    with pytest.raises(ValueError, match=r"method .small.: 3 configurations .*\(it trains nothing\)"):
        search_grid("small", trains=False)
    with pytest.raises(ValueError, match=r"method 'three' searches \['config.a', 'config.b', 'config.c'\]"):
        search_grid("three", trains=True)
    assert len(search_grid("wide", trains=True)) == BUDGET  # a constant axis is not a knob
    with pytest.raises(ValueError, match="either 'points' or axes"):
        search_grid("both", trains=True)


def test_a_pick_on_the_top_edge_extends_until_it_is_interior_then_checks_its_other_axes():
    grid = [{LR: lr, "config.k": k} for lr in (3e-4, 1e-3, 3e-3) for k in (1, 2, 4, 8)]
    record = search(grid, _score_peaked_at(**{LR: 2.7e-2, "config.k": 2}), _always_valid, max_extensions=5)
    # 3e-3 is the top: 9e-3 is better, then 2.7e-2, then 8.1e-2 is worse: interior on the learning rate.
    assert [e["point"][LR] for e in record["extensions"][:3]] == [9e-3, 2.7e-2, 8.1e-2]
    first = record["extensions"][:3]
    assert all(e["axis"] == LR and e["side"] == "high" and e["point"]["config.k"] == 2 for e in first)
    # k = 2 was only run at the grid's rates: its neighbours 1 and 4 run at 2.7e-2 (checks), and lose.
    assert [(e["point"], e.get("check")) for e in record["extensions"][3:]] == [
        ({LR: 2.7e-2, "config.k": 1}, True), ({LR: 2.7e-2, "config.k": 4}, True)]
    assert record["pick_point"] == {LR: 2.7e-2, "config.k": 2} and record["edge"] is False
    assert record["edge_axes"] == [] and len(record["validation_A_T"]) == len(grid)
    # With three runs the checks never run, and the pick says so.
    short = search(grid, _score_peaked_at(**{LR: 2.7e-2, "config.k": 2}), _always_valid, max_extensions=3)
    assert short["pick_point"] == {LR: 2.7e-2, "config.k": 2} and short["edge"] is True
    assert short["edge_axes"] == [{"axis": "config.k", "side": side, "reason": "neighbour not run: extensions used up"}
                                  for side in ("low", "high")]
    assert recorded_flags(short) == {"edge": True, "edge_axes": short["edge_axes"]}
    assert recorded_flags(record) == {"edge": False, "edge_axes": []}


def test_a_check_that_beats_an_extended_pick_moves_it():
    # The grid's best k (8) at the top rate; the rate extends to 9e-3, where k = 4 is best: the check of
    # k's lower neighbour at 9e-3 finds it, and the search goes on from there.
    def score(p):
        rate = {3e-4: 0.1, 1e-3: 0.2, 3e-3: 0.3, 9e-3: 0.4}.get(p[LR], 0.0)
        return rate + (0.2 * (p["config.k"] == 4) if p[LR] == 9e-3 else 0.05 * (p["config.k"] == 8))
    grid = [{LR: lr, "config.k": k} for lr in (3e-4, 1e-3, 3e-3) for k in (1, 2, 4, 8)]
    record = search(grid, score, _always_valid, max_extensions=12)
    assert {LR: 9e-3, "config.k": 8} in [e["point"] for e in record["extensions"]]
    assert record["pick_point"] == {LR: 9e-3, "config.k": 4} and record["edge"] is False


def test_a_resumed_search_starts_from_the_best_point_it_recorded():
    # An earlier search (another rule) walked k out to 64 at the grid's lowest rate; resumed, the search keeps
    # that pick and runs only what it lacks: the rate's neighbours at k = 64.
    grid = [{LR: lr, "config.k": k} for lr in (3e-4, 1e-3, 3e-3) for k in (1, 2, 4, 8)]
    score = _score_peaked_at(**{LR: 3e-4, "config.k": 64})
    earlier = [{"point": {LR: 3e-4, "config.k": k}, "validation_A_T": score({LR: 3e-4, "config.k": k}),
                "axis": "config.k", "side": "high"} for k in (16, 32, 64, 128)]
    ran = []
    record = search(grid, lambda p: ran.append(p) or score(p), _always_valid, max_extensions=8, earlier=earlier)
    assert record["extensions"][:4] == earlier and record["pick_point"] == {LR: 3e-4, "config.k": 64}
    assert ran[len(grid):] == [{LR: 9e-5, "config.k": 64}, {LR: 1e-3, "config.k": 64}]  # an edge, then a check
    assert record["edge"] is False


def test_a_pick_still_on_an_edge_after_the_extensions_is_flagged():
    grid = [{LR: lr, "config.k": k} for lr in (3e-4, 1e-3, 3e-3) for k in (1, 2, 4, 8)]
    record = search(grid, _score_peaked_at(**{LR: 1e-7, "config.k": 4}), _always_valid, max_extensions=3)
    assert [e["point"][LR] for e in record["extensions"]] == [9e-5, 2.7e-5, 8.1e-6]
    assert record["edge"] is True
    assert record["edge_axes"] == [{"axis": LR, "side": "low", "reason": "extensions used up"}] + [
        {"axis": "config.k", "side": side, "reason": "neighbour not run: extensions used up"}
        for side in ("low", "high")
    ]


def test_an_edge_that_cannot_extend_is_flagged_as_the_end_of_its_range():
    # k = 1 at the bottom of an integer axis (no step below 1); a shrinkage whose next step is invalid.
    grid = [{"config.k": k} for k in (1, 2, 3, 5)]
    record = search(grid, lambda p: 1.0 / p["config.k"], _always_valid)
    assert record["extensions"] == [] and record["pick_point"] == {"config.k": 1}
    assert record["edge_axes"] == [{"axis": "config.k", "side": "low", "reason": "end of the axis's valid range"}]
    grid = [{"config.head_options.shrinkage": s} for s in (0.01, 0.1, 0.3)]
    record = search(grid, lambda p: p["config.head_options.shrinkage"],
                    lambda p: p["config.head_options.shrinkage"] <= 1)
    assert [e["point"]["config.head_options.shrinkage"] for e in record["extensions"]] == [0.9]
    assert record["edge"] and record["edge_axes"][0]["reason"] == "end of the axis's valid range"


def test_ties_keep_the_centre_pick_so_a_flat_axis_costs_no_run():
    grid = [{LR: lr, "training.weight_decay": wd} for lr in (3e-4, 1e-3, 3e-3) for wd in (1e-3, 1e-2, 1e-1, 1.0)]
    record = search(grid, lambda p: 0.5, _always_valid)
    # The search starts at the grid's centre and a tie never moves it: both axes are inert, nothing extends.
    assert record["extensions"] == [] and record["pick_point"] == {LR: 1e-3, "training.weight_decay": 1e-2}
    assert record["inert_axes"] == [LR, "training.weight_decay"] and record["effective_budget"] == 1
    assert not record["edge"]


def test_step_past_is_geometric_and_selected_merges_nested_fields():
    assert step_past(3e-3, 1e-3) == 9e-3 and step_past(3e-4, 1e-3) == 9e-5
    assert step_past(20, 10) == 40 and step_past(1, 2) is None and step_past(0.0, 1e-3) is None

    class Config:
        head_options = {"projection_dim": 2048, "ridge_lambda": 1.0}

    chosen = selected({LR: 1e-3, "config.head_options.ridge_lambda": 10.0, "config.k": 3}, Config())
    assert chosen == {LR: 1e-3, "config.head_options": {"projection_dim": 2048, "ridge_lambda": 10.0}, "config.k": 3}
    assert json.loads(json.dumps(chosen)) == chosen  # the pick goes to selection.json as is


def test_the_tune_summary_reports_the_pick_with_its_extensions(monkeypatch, capsys, tmp_path):
    """The line `hf-clroute tune` prints is the recorded pick's validation score, extensions included."""
    import hf_clroute.bench.runners.tune as tune_module
    from hf_clroute.cli import main

    record = {"pick": {"training.weight_decay": 10.0}, "grid": [{}] * 12, "validation_A_T": [0.13] * 12,
              "extensions": [{"validation_A_T": 0.146}], "pick_validation_A_T": 0.146}
    monkeypatch.setattr(tune_module, "tune", lambda *a, **k: {"methods": {"rwf-head-only": record}})
    assert main(["tune", "--suite", "split-mnist", "--methods", "rwf-head-only", "--out", str(tmp_path)]) == 0
    assert "validation A_T 14.6  (13 configs, 1 of them extensions)" in capsys.readouterr().out


def test_resume_reads_the_earlier_runs_and_only_the_new_extensions_train(tiny_suite, tmp_path, monkeypatch):
    """An edge pick left by the extension limit is continued: the scores recorded are read, not trained
    again, and the result is the search a higher limit would have made from the start."""
    from hf_clroute.bench.harness.suites import SuiteConfig

    monkeypatch.delenv("HF_CLROUTE_PRECISION", raising=False)
    data = json.loads(open(tiny_suite).read())
    path = tmp_path / "tiny-val.json"
    path.write_text(json.dumps({**data, "validation_per_class": 4}))
    suite = SuiteConfig.load(str(path))
    trained = []

    def run_method(suite, method, seed, *, selected, **kwargs):  # validation A_T rises with the learning rate
        trained.append(selected[LR])
        return selected[LR], None, None

    monkeypatch.setattr(tuning, "run_method", run_method)
    monkeypatch.setattr(tuning, "summarize_result", lambda lr, scenario: {"A_T": math.log10(lr)})
    first = tuning.tune(suite, ["finetune"], tmp_path / "first", max_extensions=1)["methods"]["finetune"]
    assert first["edge"] and first["edge_axes"][0]["reason"] == "extensions used up" and len(trained) == BUDGET + 1

    trained.clear()
    resumed = tuning.tune(suite, ["finetune"], tmp_path / "first", max_extensions=3,
                          resume=tmp_path / "first" / "selection.json")["methods"]["finetune"]
    assert trained == [0.027, 0.081]  # only the two new steps past 9e-3 trained
    assert resumed["resumed"]["runs_read"] == BUDGET + 1 and resumed["max_extensions"] == 3
    trained.clear()
    fresh = tuning.tune(suite, ["finetune"], tmp_path / "fresh", max_extensions=3)["methods"]["finetune"]
    assert len(trained) == BUDGET + 3
    assert {k: v for k, v in resumed.items() if k != "resumed"} == fresh
    # another seed's (or method's) search is not resumed
    with pytest.raises(ValueError, match="seed"):
        tuning.tune(suite, ["finetune"], tmp_path / "x", seed=1, resume=tmp_path / "first" / "selection.json")
    with pytest.raises(ValueError, match="no search of method 'ncm'"):
        tuning.tune(suite, ["ncm"], tmp_path / "x", resume=tmp_path / "first" / "selection.json")
    # the precision setting is part of the search: another one is refused, and a record made before tune
    # recorded it resumes only with the setting given explicitly
    fp32 = dataclasses.replace(suite, training={**suite.training, "precision": "fp32"})
    with pytest.raises(ValueError, match="precision 'auto', this run's is 'fp32': resume with --precision auto"):
        tuning.tune(fp32, ["finetune"], tmp_path / "x", max_extensions=4, resume=tmp_path / "first" / "selection.json")
    record = json.loads((tmp_path / "first" / "selection.json").read_text())
    assert record["methods"]["finetune"]["precision"] == "auto"
    del record["methods"]["finetune"]["precision"]
    (tmp_path / "old.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="recorded no precision setting .* give --precision"):
        tuning.tune(suite, ["finetune"], tmp_path / "x", max_extensions=4, resume=tmp_path / "old.json")
    assert tuning.tune(fp32, ["finetune"], tmp_path / "x", max_extensions=4,
                       resume=tmp_path / "old.json")["methods"]["finetune"]["precision"] == "fp32"
    with pytest.raises(ValueError, match="max_extensions"):
        tuning.tune(suite, ["finetune"], tmp_path / "x", max_extensions=-1)


def test_a_stopped_search_continues_from_the_scores_it_measured(tiny_suite, tmp_path, monkeypatch):
    """Each score is kept as soon as it is measured: a search stopped part-way (here, killed at its 5th
    configuration) is continued by the same command, which trains only what is left and picks what an
    unbroken search picks; the progress file goes once the pick is in selection.json."""
    from hf_clroute.bench.harness.suites import SuiteConfig

    monkeypatch.delenv("HF_CLROUTE_PRECISION", raising=False)
    data = json.loads(open(tiny_suite).read())
    path = tmp_path / "tiny-val.json"
    path.write_text(json.dumps({**data, "validation_per_class": 4}))
    suite = SuiteConfig.load(str(path))
    trained, stop_at = [], [5]

    def run_method(suite, method, seed, *, selected, **kwargs):
        if len(trained) + 1 == stop_at[0]:
            raise KeyboardInterrupt  # the sitting ends
        trained.append(selected[LR])
        return selected, None, None

    monkeypatch.setattr(tuning, "run_method", run_method)
    peak = _score_peaked_at(**{LR: 1e-3, "training.weight_decay": 1e-2})
    monkeypatch.setattr(tuning, "summarize_result", lambda point, scenario: {"A_T": peak(point)})
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        tuning.tune(suite, ["finetune"], out)
    progress = json.loads((out / tuning.PROGRESS_FILE).read_text())["finetune"]
    assert len(progress["scores"]) == 4 and not (out / "selection.json").exists()
    done, stop_at[0] = list(trained), 0
    record = tuning.tune(suite, ["finetune"], out)["methods"]["finetune"]
    assert len(trained) - len(done) == BUDGET - 4 and record["progress_read"] == 4  # nothing trained twice
    assert not (out / tuning.PROGRESS_FILE).exists()
    trained.clear()
    fresh = tuning.tune(suite, ["finetune"], tmp_path / "fresh")["methods"]["finetune"]
    assert len(trained) == BUDGET  # a finished search leaves no progress behind: a new one measures afresh
    assert {k: v for k, v in record.items() if k != "progress_read"} == fresh
    # another seed's search does not read this one's scores
    stop_at[0] = len(trained) + 2
    with pytest.raises(KeyboardInterrupt):
        tuning.tune(suite, ["finetune"], tmp_path / "seeds")
    stop_at[0] = 0
    assert "progress_read" not in tuning.tune(suite, ["finetune"], tmp_path / "seeds", seed=1)["methods"]["finetune"]


def test_joint_training_final_form_scores_its_epochs_from_one_run_with_separate_runs_scores(tiny_suite, tmp_path,
                                                                                              monkeypatch):
    """Joint training's final form trains once, on one stream read E times in the same order, so its e-epoch
    run is the first e epochs of its E-epoch run: tune scores the 1/2/4/8-epoch points of a learning rate
    from one 8-epoch run, read on validation at each epoch's end, and every score is what a separate run
    measures (real training on a tiny suite)."""
    from hf_clroute.bench.harness.suites import SuiteConfig

    monkeypatch.delenv("HF_CLROUTE_PRECISION", raising=False)
    data = json.loads(open(tiny_suite).read())
    path = tmp_path / "tiny-val.json"
    # 8 training examples a class after validation's 8, 4 classes, batches of 8: 4 steps an epoch; 32
    # validation examples, so a score moves in steps of 1/32
    path.write_text(json.dumps({**data, "validation_per_class": 8, "probe_forgetting": False}))
    suite = SuiteConfig.load(str(path))
    runs, real_run = [], tuning.run_method

    def run_method(suite, method, seed, *, selected, **kwargs):
        runs.append(selected["training.epochs"])
        return real_run(suite, method, seed, selected=selected, **kwargs)

    monkeypatch.setattr(tuning, "run_method", run_method)
    shared = tuning.tune(suite, ["joint-offline"], tmp_path / "shared", max_extensions=0)["methods"]["joint-offline"]
    assert runs == [8, 8, 8]  # one run per learning rate
    assert [r["read_at_epochs"] for r in shared["shared_epochs"]] == [[1, 2, 4]] * 3
    runs.clear()
    monkeypatch.setattr(tuning, "epoch_siblings", lambda point, grid, done: [])
    tuned = tuning.tune(suite, ["joint-offline"], tmp_path / "separate", max_extensions=0)
    separate = tuned["methods"]["joint-offline"]
    assert runs == [1, 2, 4, 8] * 3 and "shared_epochs" not in separate
    assert shared["validation_A_T"] == pytest.approx(separate["validation_A_T"], abs=1e-12)
    assert len(set(separate["validation_A_T"])) > 3  # the epochs and rates do move the score
    assert shared["pick_point"] == separate["pick_point"]


def test_epochs_are_not_shared_when_an_epoch_ends_inside_a_batch(tiny_suite, tmp_path, monkeypatch):
    """With batches of 7 over 32 examples an epoch's last batch would take the next epoch's first rows in a
    longer run, so the e-epoch run is not its prefix: every point runs alone."""
    from hf_clroute.bench.harness.suites import SuiteConfig

    monkeypatch.delenv("HF_CLROUTE_PRECISION", raising=False)
    data = json.loads(open(tiny_suite).read())
    path = tmp_path / "tiny-val.json"
    path.write_text(json.dumps({**data, "validation_per_class": 8, "probe_forgetting": False,
                                "training": {**data["training"], "batch_size": 7}}))
    runs = []
    monkeypatch.setattr(tuning, "run_method", lambda suite, method, seed, *, selected, **kwargs: (
        runs.append(selected["training.epochs"]) or selected, None, None))
    monkeypatch.setattr(tuning, "summarize_result",  # the rate moves the score too: no axis is inert
                        lambda point, scenario: {"A_T": point["training.epochs"] / 10 + point[LR]})
    record = tuning.tune(SuiteConfig.load(str(path)), ["joint-offline"], tmp_path, max_extensions=0)
    assert runs == [1, 2, 4, 8] * 3 and "shared_epochs" not in record["methods"]["joint-offline"]
