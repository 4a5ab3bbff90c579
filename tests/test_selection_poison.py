"""Selection never reads test: with every test label made wrong, every pick stays the same.

Each test runs a selection twice on the tiny MNIST suite, once on the suite's stream and once on the
same stream with its test split poisoned (each test label moved to the next class of its task, so a
model that is right on test is now wrong), and checks that the test scores moved (the poison reached
the run) while every pick did not: ``hf-clroute tune``, the headroom test (each adapter's epochs and
learning rate, each readout's knob), RanPAC's GCV lambda and the deep-forgetting probe's L2.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from hf_clroute.bench.harness.suites import SuiteConfig, build_stream


def poison(stream: list) -> list:
    """The stream with every test label replaced by the next class of its task."""
    out = []
    for e in stream:
        following = {c: e.classes[(i + 1) % len(e.classes)] for i, c in enumerate(e.classes)}
        test = e.test.map(lambda batch: {"label": [following[y] for y in batch["label"]]}, batched=True)
        out.append(dataclasses.replace(e, test=test))
    return out


def poisoned_build_stream(suite, seed):
    return poison(build_stream(suite, seed))


@pytest.fixture(scope="module")
def val_suite(tiny_suite, tmp_path_factory):
    path = tmp_path_factory.mktemp("poison") / "tiny-val.json"
    path.write_text(json.dumps({"base": str(tiny_suite), "name": "tiny-mnist-val", "validation_per_class": 4}))
    return path


def test_the_poison_moves_every_test_label(val_suite):
    suite = SuiteConfig.load(str(val_suite))
    clean, poisoned = build_stream(suite, 0), poisoned_build_stream(suite, 0)
    for a, b in zip(clean, poisoned):
        assert all(x != y for x, y in zip(a.test["label"], b.test["label"]))
        assert a.validation["label"] == b.validation["label"] and a.train["label"] == b.train["label"]


def test_tune_picks_the_same_on_a_poisoned_test_split(val_suite, tmp_path, monkeypatch):
    from hf_clroute.bench.runners import tune as tuning

    suite = SuiteConfig.load(str(val_suite))
    clean = tuning.tune(suite, ["slda", "finetune"], tmp_path / "clean")
    monkeypatch.setattr(tuning, "build_stream", poisoned_build_stream)
    poisoned = tuning.tune(suite, ["slda", "finetune"], tmp_path / "poisoned")
    for method in ("slda", "finetune"):
        a, b = clean["methods"][method], poisoned["methods"][method]
        assert a["pick"] == b["pick"] and a["validation_A_T"] == b["validation_A_T"]
        assert a["extensions"] == b["extensions"]


def test_headroom_picks_the_same_on_a_poisoned_test_split(val_suite, tmp_path, monkeypatch):
    from hf_clroute.bench.studies import headroom

    study = tmp_path / "headroom-poison.json"
    study.write_text(json.dumps({"name": "headroom-poison", "runner": "headroom", "suite": str(val_suite),
                                 "adapters": ["lastblock"], "epochs": [1, 2], "learning_rates": [0.001],
                                 "ranpac_projection_dim": 64, "max_extensions": 1}))
    clean = headroom.run(str(study), methods=None, seeds=[0], quick=False, out=tmp_path / "clean")
    monkeypatch.setattr(headroom, "build_stream", poisoned_build_stream)
    poisoned = headroom.run(str(study), methods=None, seeds=[0], quick=False, out=tmp_path / "poisoned")
    a, b = clean["methods"]["lastblock"]["per_seed"][0], poisoned["methods"]["lastblock"]["per_seed"][0]
    assert a["pick"] == b["pick"] and a["grid"] == b["grid"] and a["extensions"] == b["extensions"]
    for readout in headroom.READOUTS:
        ra, rb = a["readouts"][readout], b["readouts"][readout]
        for key in ("pick", "frozen_pick", "validation", "frozen_validation", "edge", "frozen_edge"):
            assert ra[key] == rb[key], (readout, key)
        assert ra["adapted"] != rb["adapted"]  # the test scores did read the poisoned labels
    assert clean["strongest_readout"] == poisoned["strongest_readout"]


def test_ranpac_gcv_lambda_is_the_same_on_a_poisoned_test_split(val_suite):
    from hf_clroute.bench.runners.classification import run_method

    suite = SuiteConfig.load(str(val_suite))
    options = {"head_options": {"projection_dim": 256, "ridge_lambda": 1.0, "nonlinearity": "relu",
                                "lambda_mode": "gcv", "gcv_min_classes": 1}}  # GCV at every solve
    runs = [run_method(suite, "ranpac-gcv", 0, stream=stream, config_overrides=options, progress=False)
            for stream in (build_stream(suite, 0), poisoned_build_stream(suite, 0))]
    (clean, clean_model, _), (poisoned, poisoned_model, _) = runs
    assert clean_model.head.solved_by == "gcv"
    assert clean_model.head.solved_lambda == poisoned_model.head.solved_lambda
    assert clean.accuracy_matrix != poisoned.accuracy_matrix


def test_the_probe_chooses_its_l2_the_same_on_a_poisoned_test_split(val_suite, monkeypatch):
    import torch
    from transformers import ViTModel

    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.baselines import NCMConfig
    from hf_clroute.bench.harness import probes
    from hf_clroute.bench.harness.suites import load_suite_backbone
    from hf_clroute.core.model import get_cl_model

    chosen = []
    fit_probe = probes.fit_probe

    def spy(*args, **kwargs):
        predict = fit_probe(*args, **kwargs)
        chosen.append(predict.weight_decay)
        return predict

    monkeypatch.setattr(probes, "fit_probe", spy)
    suite = SuiteConfig.load(str(val_suite))
    _, collator = load_suite_backbone(suite)
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config()), NCMConfig())
    scores = [probes.probe_seen_tasks(model, stream, collator)
              for stream in (build_stream(suite, 0), poisoned_build_stream(suite, 0))]
    assert len(chosen) == 2 and chosen[0] == chosen[1]
    assert [s["probe_accuracy"] for s in scores[0]] != [s["probe_accuracy"] for s in scores[1]]
