"""QOA's plasticity claim in its regime (issue 32): the committed suite is the regime the issue asks
for, QOA's support really has the stated size, and the runner writes its results."""

from __future__ import annotations

import json

import pytest
import torch

from hf_clroute.bench.runners.plasticity import build_learner, load_plasticity_suite, run


def test_the_regime_suite_is_plain_backprop_against_continual_backprop_and_qoa():
    suite = load_plasticity_suite("permuted-mnist-plasticity", quick=False)
    assert suite.kind == "permuted-mnist" and suite.image_size == 7
    assert {"backprop", "cbp", "qoa"} <= set(suite.methods)
    # enough steps per task and tasks for backprop to lose plasticity: 200 steps x 120 tasks
    assert suite.train_per_task // suite.batch_size >= 200 and suite.n_tasks >= 100
    # the support is drawn from one task's sub-buffer, which must hold at least that many items
    assert suite.qoa["support_size"] <= suite.qoa["buffer_size"] <= suite.train_per_task


def test_qoa_support_has_the_configured_size_once_the_task_buffer_holds_it():
    suite = load_plasticity_suite("permuted-mnist-plasticity", quick=True)
    learner = build_learner("qoa", suite, 49, seed=0).learner
    g = torch.Generator().manual_seed(0)
    n = suite.qoa["buffer_size"]
    x, y = torch.rand(n, 49, generator=g), torch.randint(0, 10, (n,), generator=g)
    for xb, yb in zip(x.split(10), y.split(10)):
        learner.observe(xb, yb, task=3)
    _, support_x, support_y = learner.prepare(x[:5], task=3, train=True)
    assert len(support_x) == suite.qoa["support_size"] == len(support_y)
    assert learner.prepare(x[:5], task=4, train=True) is None  # another task's sub-buffer is its own


def test_quick_run_writes_plasticity_and_hessian_rank_per_method(tmp_path):
    results = run("permuted-mnist-plasticity", methods=None, seeds=[0], quick=True, out=tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["n_tasks"] == 6 and "source_file" not in saved["config"]
    for name in ("backprop", "cbp", "qoa"):
        row = results["methods"][name]
        assert len(row["per_seed"][0]["newest"]) == 6
        assert {"plasticity_drop", "erank_first", "erank_last"} <= set(row)


def test_the_paper_support_row_is_qoa_with_a_support_of_1000_in_training_and_evaluation():
    suite = load_plasticity_suite("permuted-mnist-plasticity", quick=False)
    learner_name, variant = suite.for_method("qoa-s1000")
    assert learner_name == "qoa" and variant.qoa["support_size"] == variant.qoa["eval_support_size"] == 1000
    assert variant.qoa["support_size"] <= variant.qoa["buffer_size"]
    # only QOA's block changes: the stream and every other setting are the base rows'
    base_rest = {k: v for k, v in vars(suite).items() if k != "qoa"}
    assert {k: v for k, v in vars(variant).items() if k != "qoa"} == base_rest
    assert suite.qoa["support_size"] == 100  # the base row is untouched
    learner = build_learner(learner_name, variant, 49, seed=0).learner
    x, y = torch.rand(1000, 49), torch.randint(0, 10, (1000,))
    for xb, yb in zip(x.split(10), y.split(10)):
        learner.observe(xb, yb, task=0)
    assert len(learner.prepare(x[:5], task=0, train=True)[1]) == 1000
    assert len(learner.prepare(x[:5], task=0, train=False)[1]) == 1000


def test_a_variant_run_apart_merges_beside_the_base_rows_on_the_same_stream(tmp_path):
    from hf_clroute.bench.runners.plasticity import merge

    run("permuted-mnist-plasticity", methods=["backprop", "qoa"], seeds=[0], quick=True, out=tmp_path / "base")
    run("permuted-mnist-plasticity", methods=["qoa-s1000"], seeds=[0], quick=True, out=tmp_path / "variant")
    merged = merge([tmp_path / "base", tmp_path / "variant"], tmp_path / "merged")
    assert set(merged["methods"]) == {"backprop", "qoa", "qoa-s1000"}
    base, variant = merged["methods"]["qoa"]["per_seed"][0], merged["methods"]["qoa-s1000"]["per_seed"][0]
    assert len(variant["newest"]) == len(base["newest"]) == 6
    assert variant["newest"] != base["newest"]  # a larger support reads the buffer differently


@pytest.mark.parametrize("entry, message", [
    ({"method": "sgd"}, "needs \"method\""),
    ({"method": "qoa", "qoa": {"support_size": 10}, "optimizer": "sgd"}, "unknown key(s) ['optimizer']"),
    ({"method": "qoa", "qoa": 10}, "qoa must be an object"),
])
def test_a_bad_variant_is_refused_naming_it(entry, message):
    from hf_clroute.bench.runners.plasticity import PlasticitySuite

    with pytest.raises(ValueError, match="method_settings\\['mine'\\]") as err:
        PlasticitySuite(name="s", kind="permuted-mnist", method_settings={"mine": entry})
    assert message in str(err.value)
    with pytest.raises(ValueError, match="built-in"):
        PlasticitySuite(name="s", kind="permuted-mnist", method_settings={"qoa": {"method": "qoa"}})
    with pytest.raises(ValueError, match="unknown plasticity method"):
        run("permuted-mnist-plasticity", methods=["qoa-s100"], seeds=[0], quick=True, out="never-created")
