"""The one search rule `hf-clroute tune` applies to every row, by itself.

An edge pick extends to the one limit without a resume; a pick moves only on a gain of at least one
standard error of validation accuracy (ties and noise keep the pick, which starts at the grid's centre);
an axis that scores the same at every value is reported inert, its grid runs go to the other axes, and
``effective_budget`` counts the distinct effective configurations. Scores are synthetic (a function of
the point, or a mocked per-point runner as in tests/test_tune.py), so nothing trains.
"""

from __future__ import annotations

import json
import math

import pytest

from hf_clroute.bench.harness import grid_search
from hf_clroute.bench.harness.grid_search import (
    MAX_EXTENSIONS,
    centre,
    effective_count,
    move_threshold,
    recorded_flags,
    search,
)
from hf_clroute.bench.runners import tune as tuning

LR = "training.learning_rate"
GRID = [{LR: lr, "config.k": k} for lr in (3e-4, 1e-3, 3e-3) for k in (1, 2, 4, 8)]


def _valid(point):
    return True


def _tiny_validation_suite(tiny_suite, tmp_path, monkeypatch):
    from hf_clroute.bench.harness.suites import SuiteConfig

    monkeypatch.delenv("HF_CLROUTE_PRECISION", raising=False)
    data = json.loads(open(tiny_suite).read())
    path = tmp_path / "tiny-val.json"
    path.write_text(json.dumps({**data, "validation_per_class": 4}))  # 4 classes: 16 validation examples
    return SuiteConfig.load(str(path))


def test_the_limit_covers_every_committed_manual_extension():
    # The most runs any committed search was resumed to was 18 (and the most it used, 15).
    assert MAX_EXTENSIONS >= 18


def test_an_edge_pick_extends_to_the_one_limit_by_itself():
    # The validation score keeps rising with the rate, 3 points a step (over one SE at N = 1000): the pick
    # walks up the rate axis run after run, with no resume, until the limit, and is flagged there.
    def score(p):
        return 0.2 + 0.03 * math.log(p[LR] / 3e-4, 3) - 0.01 * abs(math.log2(p["config.k"] / 2))
    record = search(GRID, score, _valid, n_validation=1000)
    assert len(record["extensions"]) == MAX_EXTENSIONS and record["search_rule"]["max_extensions"] == MAX_EXTENSIONS
    assert all(e["axis"] == LR and e["side"] == "high" for e in record["extensions"])
    assert record["pick_point"] == record["extensions"][-1]["point"]
    assert record["edge"] and record["edge_axes"][0] == {"axis": LR, "side": "high", "reason": "extensions used up"}


def test_tune_extends_an_edge_pick_to_its_limit_without_resume(tiny_suite, tmp_path, monkeypatch):
    """`tune` with no --resume and no --max-extensions runs the module's one limit (here set to 5), and
    records the rule: the limit, the validation size the move threshold is measured on, the threshold."""
    suite = _tiny_validation_suite(tiny_suite, tmp_path, monkeypatch)
    trained = []

    def run_method(suite, method, seed, *, selected, **kwargs):
        trained.append(selected)
        return selected, None, None

    def a_t(point, scenario):  # 15 points a rate step (over one SE at N = 16); the centre's weight decay is best
        steps = round(math.log(point[LR] / 3e-4, 3))
        return {"A_T": 0.05 + 0.15 * steps + 0.01 * (point["training.weight_decay"] == 1e-2)}

    monkeypatch.setattr(tuning, "run_method", run_method)
    monkeypatch.setattr(tuning, "summarize_result", a_t)
    monkeypatch.setattr(tuning, "MAX_EXTENSIONS", 5)
    selection = tuning.tune(suite, ["finetune"], tmp_path / "out")
    record = selection["methods"]["finetune"]
    assert len(trained) == tuning.BUDGET + 5 and "resumed" not in record
    assert [e["point"][LR] for e in record["extensions"]] == [9e-3, 2.7e-2, 8.1e-2, 0.243, 0.729]
    assert record["max_extensions"] == record["search_rule"]["max_extensions"] == 5 and record["edge"]
    assert record["search_rule"]["n_validation"] == 16 and record["search_rule"]["se_multiple"] == 1.0
    p = record["pick_validation_A_T"]
    assert record["move_threshold"] == pytest.approx(math.sqrt(min(p, 1) * (1 - min(p, 1)) / 16))
    assert record["effective_budget"] == tuning.BUDGET + 5 and record["inert_axes"] == []
    assert selection["max_extensions"] == 5 and selection["se_multiple"] == 1.0


def test_a_gain_inside_one_standard_error_keeps_the_pick_and_a_larger_one_moves_it():
    # N = 1000 validation examples: one SE at 0.486 is 1.58 points.
    assert move_threshold(0.486, 1000) == pytest.approx(math.sqrt(0.486 * 0.514 / 1000))
    grid = [{"config.pull": w} for w in (1.0, 10.0, 100.0)]
    assert centre(grid) == {"config.pull": 10.0}

    def scores(top):
        return lambda p: {1.0: 0.40, 10.0: 0.486, 100.0: top}.get(p["config.pull"], 0.30)

    noise = search(grid, scores(0.490), _valid, n_validation=1000)  # 0.4 points better: noise
    assert noise["pick_point"] == {"config.pull": 10.0} and noise["moves"] == []
    assert noise["move_threshold"] == pytest.approx(math.sqrt(0.486 * 0.514 / 1000))
    assert noise["extensions"] == [] and not noise["edge"]  # the centre is interior: nothing to extend
    real = search(grid, scores(0.516), _valid, n_validation=1000)  # 3 points better: a move
    assert real["pick_point"] == {"config.pull": 100.0}
    [move] = real["moves"]
    assert move["from"] == {"config.pull": 10.0} and move["to"] == {"config.pull": 100.0}
    assert move["gain"] == pytest.approx(0.03) and move["threshold"] == pytest.approx(0.0158, abs=1e-4)
    # the new pick is on the top edge: it extends, and the extension (0.30) does not move it
    assert [e["point"] for e in real["extensions"]] == [{"config.pull": 1000.0}] and not real["edge"]
    assert real["search_rule"]["n_validation"] == 1000 and real["search_rule"]["start"] == "the grid's centre"


def test_ties_and_noise_keep_the_earlier_pick_which_starts_at_the_grid_centre():
    # The centre: the middle rate and the lower middle of k's four values.
    assert centre(GRID) == {LR: 1e-3, "config.k": 2}
    # A grid point that ties the centre's score, or beats it by less than an SE, does not move the pick,
    # though it is the first run or the argmax.
    flat = {(3e-4, 1): 0.5, (1e-3, 2): 0.5, (3e-3, 4): 0.505}
    record = search(GRID, lambda p: flat.get((p[LR], p["config.k"]), 0.45), _valid, n_validation=1000)
    assert record["pick_point"] == {LR: 1e-3, "config.k": 2} and record["moves"] == []
    # An extension that only ties the pick (or beats it by less than an SE) leaves the earlier point picked.
    grid = [{"config.w": w} for w in (1.0, 2.0)]  # centre: the first, on the low edge
    tie = search(grid, lambda p: 0.6 if p["config.w"] <= 1 else 0.55, _valid, n_validation=1000)
    assert [e["point"] for e in tie["extensions"]] == [{"config.w": 0.5}]
    assert tie["pick_point"] == {"config.w": 1.0} and not tie["edge"]


def test_an_inert_axis_is_flagged_and_its_budget_goes_to_the_other_axes():
    # A key-pull weight whose every value scores the same (its scale cancels): the rate alone decides.
    grid = [{LR: lr, "config.pull": w} for lr in (3e-4, 1e-3, 3e-3) for w in (0.01, 0.1, 1.0, 10.0)]

    def score(p):
        return 0.5 - 0.1 * abs(math.log10(p[LR] / 1e-3))
    record = search(grid, score, _valid, n_validation=1000)
    assert record["inert_axes"] == ["config.pull"]
    assert record["pick_point"] == {LR: 1e-3, "config.pull": 0.1}
    # the pull weight is never extended or checked; the 9 runs its grid wasted refine the rate around the pick
    assert record["search_rule"]["runs_freed_by_inert_axes"] == len(grid) - 3
    assert all(e["axis"] == LR and e.get("refine") for e in record["extensions"])
    assert len(record["extensions"]) == len(grid) - 3
    assert sorted({e["point"][LR] for e in record["extensions"]})[:2] == [5.48e-4, 7.4e-4]
    # effective budget: 3 rates on the grid and every refinement, one configuration each
    assert record["effective_budget"] == 3 + len(record["extensions"]) == len(grid)
    assert not record["edge"] and recorded_flags(record)["edge"] is False


def test_an_inert_axis_on_its_edge_is_not_extended_and_not_flagged():
    grid = [{LR: lr, "config.pull": w} for lr in (3e-4, 1e-3, 3e-3) for w in (0.01, 0.1)]
    assert centre(grid) == {LR: 1e-3, "config.pull": 0.01}  # on the pull weight's low edge

    def score(p):
        return 0.5 - 0.1 * abs(math.log10(p[LR] / 1e-3))
    record = search(grid, score, _valid, n_validation=1000)
    assert record["inert_axes"] == ["config.pull"] and not record["edge"]
    assert not [e for e in record["extensions"] if e["axis"] == "config.pull"]
    assert record["effective_budget"] == 3 + len(record["extensions"])
    # read back from the record, the inert axis's edge stays unflagged
    assert recorded_flags(record) == {"edge": False, "edge_axes": []}


def test_effective_count_merges_only_points_that_differ_on_inert_axes_and_score_the_same():
    points = [{LR: 1e-3, "w": 1}, {LR: 1e-3, "w": 2}, {LR: 3e-3, "w": 1}, {LR: 3e-3, "w": 2}, {LR: 1e-2, "w": 1}]
    # inert at 1e-3 (same score), not at 3e-3 (the axis moves the score there): 1 + 2 + 1
    scores = [0.5, 0.5 + 1e-12, 0.4, 0.45, 0.3]
    assert effective_count(points, scores, ["w"]) == 4
    assert effective_count(points, scores, []) == 5
    assert grid_search.inert_axes(points, scores, {LR: 1e-3, "w": 1}) == ["w"]
    assert grid_search.inert_axes(points, scores, {LR: 3e-3, "w": 1}) == []
