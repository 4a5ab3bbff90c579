"""One resolver for run settings: its written precedence, seeds, and settings that follow what a suite is."""

from __future__ import annotations

import json

import pytest
import torch

from hf_clroute import get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.bench.harness.settings import resolve_run
from hf_clroute.bench.harness.suites import SuiteConfig, read_suite_file
from hf_clroute.methods.mars import MarsConfig
from hf_clroute.methods.rwf import RwfConfig


def write_suite(tmp_path, name, **fields):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, **fields}))
    return str(path)


def test_precedence_defaults_suite_method_file_per_suite_overrides_seed(tmp_path):
    # qoa.json: config {...}, suites.split-mnist.config.max_classes = 10
    suite = SuiteConfig.load(write_suite(
        tmp_path, "mine", base="split-mnist", training={"learning_rate": 0.5, "weight_decay": 0.25},
        method_settings={"qoa": {"config": {"buffer_size": 77}}},
    ))
    settings = resolve_run(suite, "qoa", seed=4, overrides={"weight_decay": 0.125})
    training, config = settings.training, settings.adapter_config
    assert training.eval_batch_size == 256 and settings.sources["training.eval_batch_size"] == "suite training"
    assert training.weight_decay == 0.125 and settings.sources["training.weight_decay"] == "overrides"
    assert config.max_classes == 10
    assert settings.sources["config.max_classes"] == "configs/methods/qoa.json suites.split-mnist"
    assert config.buffer_size == 77 and settings.sources["config.buffer_size"] == "suite mine method_settings.qoa"
    assert training.seed == config.seed == config.head_init_seed == 4
    assert settings.sources["config.seed"] == "run seed"
    # The suite's own training block wins over a method file's (er.json sets its own rate): what the
    # suite's author wrote is never replaced silently; a built-in suite leaves the rate to the method file.
    er = resolve_run(suite, "er", 0)
    assert er.training.learning_rate == 0.5 and er.sources["training.learning_rate"] == "suite training"
    builtin = resolve_run(SuiteConfig.load("split-mnist"), "er", 0)
    assert builtin.training.learning_rate == 1e-4
    assert builtin.sources["training.learning_rate"] == "configs/methods/er.json"


def test_a_renamed_copy_of_a_builtin_suite_gets_its_method_settings(tmp_path):
    original = SuiteConfig.load("split-mnist")
    based = SuiteConfig.load(write_suite(tmp_path, "my-images", base="split-mnist"))
    for method in ("apn", "qoa", "rwf", "lora-ctl"):
        a, b = resolve_run(original, method, 0), resolve_run(based, method, 0)
        assert a.adapter_config.to_dict() == b.adapter_config.to_dict(), method
        assert a.training == b.training, method
    # A full copy that names no base and no settings gets the documented defaults, and says so.
    _, fields = read_suite_file("split-mnist")
    copy = SuiteConfig.load(write_suite(tmp_path, "copied", **{k: v for k, v in fields.items() if k != "name"}))
    apn = resolve_run(copy, "apn", 0)
    assert apn.adapter_config.num_patches != resolve_run(original, "apn", 0).adapter_config.num_patches
    assert "suites." not in apn.sources.get("config.num_patches", "")  # no per-suite block reached it


def test_bad_settings_name_the_field_and_where_it_came_from(tmp_path):
    suite = SuiteConfig.load(write_suite(tmp_path, "bad", base="split-mnist",
                                         method_settings={"rwf": {"config": {"num_promts": 3}}}))
    try:
        resolve_run(suite, "rwf", 0)
    except ValueError as err:
        assert "num_promts" in str(err) and "method_settings.rwf" in str(err)
    else:
        raise AssertionError("a misspelt field must be refused")


def test_run_seed_drives_router_and_memory_initialisation():
    suite = SuiteConfig.load("split-mnist")

    def weights(method, seed, pick):
        config = resolve_run(suite, method, seed).adapter_config
        torch.manual_seed(0)  # the same global RNG: only the run seed may differ
        from transformers import ViTModel

        model = get_cl_model(ViTModel(tiny_vit_config()), config)
        return pick(model).detach().clone()

    def router(model):
        return next(iter(model.method.routers.values())).queries

    def memory(model):
        return model.method.memory.keys

    assert isinstance(resolve_run(suite, "rwf", 1).adapter_config, RwfConfig)
    assert resolve_run(suite, "rwf", 1).adapter_config.init_seed == 1
    assert isinstance(resolve_run(suite, "mars", 2).adapter_config, MarsConfig)
    assert resolve_run(suite, "mars", 2).adapter_config.memory_init_seed == 2
    assert torch.equal(weights("rwf", 0, router), weights("rwf", 0, router))
    assert not torch.equal(weights("rwf", 0, router), weights("rwf", 1, router))
    assert not torch.equal(weights("mars", 0, memory), weights("mars", 1, memory))


def test_committed_runs_resolve_to_the_settings_they_recorded():
    """The precedence puts a suite's training block above the method files; the built-in suites state no
    learning rate, so every committed classification run still resolves to what it recorded."""
    from pathlib import Path

    from hf_clroute.bench.harness.suites import builtin_suites

    checked = 0
    for path in sorted((Path(__file__).resolve().parents[1] / "results").glob("*/results.json")):
        results = json.loads(path.read_text())
        if results.get("kind") != "classification" or results["suite"] not in builtin_suites():
            continue
        suite = SuiteConfig.load(results["suite"], quick=bool(results.get("quick")))
        for method, row in results["methods"].items():
            recorded = (row.get("settings") or {}).get("training")
            if not recorded:
                continue
            pick = (row.get("selection") or {}).get("pick")
            training = resolve_run(suite, method, results["seeds"][0], selected=pick).training
            for name in ("learning_rate", "batch_size", "epochs", "weight_decay", "max_grad_norm"):
                assert getattr(training, name) == recorded[name], (path.parent.name, method, name)
            checked += 1
    assert checked > 50


def test_show_settings_prints_each_value_and_where_it_came_from(tmp_path, capsys):
    from hf_clroute.cli import main

    mine = write_suite(tmp_path, "mine", base="split-mnist", training={"learning_rate": 0.5})
    for suite, rate, source in (("split-mnist", "0.0001", "configs/methods/er.json"), (mine, "0.5", "suite training")):
        assert main(["bench", "--suite", suite, "--methods", "er", "--seeds", "0", "--out", str(tmp_path / "out"),
                     "--show-settings", "--precision", "fp32"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert f"  training.learning_rate         = {rate}  ({source})" in lines
        assert '  training.precision             = "fp32"  (command line)' in lines
        assert "  training.seed                  = 0  (run seed)" in lines
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_null_gradient_clipping_norm_means_no_clipping(tmp_path):
    suite = SuiteConfig.load(write_suite(tmp_path, "noclip", base="split-mnist", training={"max_grad_norm": None}))
    settings = resolve_run(suite, "finetune", 0)
    assert settings.training.max_grad_norm == 0.0 and settings.sources["training.max_grad_norm"] == "suite training"


def test_a_selection_serves_its_suite_and_the_suites_based_on_it_only(tmp_path):
    from hf_clroute.bench.harness.suites import load_selection
    from hf_clroute.errors import UserInputError

    path = tmp_path / "selection.json"
    path.write_text(json.dumps({"suite": "split-mnist", "methods": {"er": {"pick": {"training.learning_rate": 0.01}}}}))
    assert load_selection(path, SuiteConfig.load("split-mnist"))["er"]["pick"] == {"training.learning_rate": 0.01}
    # a smaller-data study of the same stream reuses the picks made on that stream's validation split
    assert "er" in load_selection(path, SuiteConfig.load("split-mnist-20pct"))
    # split-mnist-r is based on split-mnist for its settings, but draws another stream (dataset, backbone)
    for other in ("split-fashion", "split-mnist-r"):
        suite = SuiteConfig.load(other)
        try:
            load_selection(path, suite)
        except UserInputError as err:
            assert "tuned on suite 'split-mnist'" in str(err) and other in str(err)
        else:
            raise AssertionError(f"a split-mnist selection was accepted for {other}")


def test_only_a_task_count_study_reuses_picks_across_task_counts(tmp_path):
    from dataclasses import replace

    from hf_clroute.bench.harness.suites import load_selection
    from hf_clroute.errors import UserInputError

    path = tmp_path / "selection.json"
    path.write_text(json.dumps({"suite": "wordnet", "methods": {"rwf": {"pick": {"training.learning_rate": 0.001}}}}))
    forty = SuiteConfig.load("wordnet-40tasks")
    assert forty.reuse_picks_across_task_counts and forty.n_tasks == 40
    assert "rwf" in load_selection(path, forty)
    # the same split without the study's opt-in is another stream: its picks must come from its own validation
    with pytest.raises(UserInputError, match="same dataset, backbone, scenario, n_tasks"):
        load_selection(path, replace(forty, reuse_picks_across_task_counts=False))
