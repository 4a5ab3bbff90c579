"""First-session adaptation and the statistics passes around it: eval mode, re-accumulation after a
freeze, trainable counts per phase, the adaptation split's disjointness, save/load, 2 processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import get_backbone_spec, pooled_features, tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, LoraBaselineConfig
from hf_clroute.bench.harness.feature_cache import encode
from hf_clroute.bench.harness.probes import model_features
from hf_clroute.core.first_session_config import AdaptationConfig, describe_record
from hf_clroute.core.model import CLModel
from hf_clroute.core.model_card import history_markdown
from hf_clroute.core.outputs import model_inputs
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator
from hf_clroute.engine.first_session import adapter_parameters, carve_adaptation_split
from hf_clroute.heads import build_head
from hf_clroute.methods.rwf import RwfConfig

REPO = Path(__file__).resolve().parents[1]
COLLATOR = ImageCollator(16, num_channels=3)


@pytest.fixture(scope="module")
def stream():
    return class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=16,
                             test_per_class=8, validation_per_class=4, name="mnist")


def dropout_vit() -> ViTModel:
    """A tiny ViT whose train-mode forward differs from its eval-mode one (dropout 0.5)."""
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config(hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5))


def fit(config, stream, backbone=None, **training):
    model = get_cl_model(backbone or dropout_vit(), config)
    settings = TrainingConfig(**{"batch_size": 8, "learning_rate": 1e-2, "progress": False, **training})
    trainer = ContinualTrainer(model, stream, settings, COLLATOR, make_accelerator(settings, cpu=True))
    return trainer, trainer.fit()


@torch.no_grad()
def eval_statistics(model: CLModel, experiences) -> dict[str, torch.Tensor]:
    """The head's statistics from one eval-mode pass of the final model over ``experiences``' training data."""
    head = model.head
    fresh = build_head(**head.extra_state())
    model.eval()
    for experience in experiences:
        for start in range(0, len(experience.train), 8):
            batch = COLLATOR([experience.train[i] for i in range(start, min(start + 8, len(experience.train)))])
            fresh.accumulate(model(**model_inputs(batch)).features, batch["labels"])
    fresh.sync()
    return {name: getattr(fresh, name) for name in fresh.statistic_names()}


def assert_statistics_equal(head, expected: dict[str, torch.Tensor]) -> None:
    for name, value in expected.items():
        torch.testing.assert_close(getattr(head, name), value, rtol=1e-6, atol=1e-6, msg=name)


def test_config_is_validated_naming_the_field():
    assert LoraBaselineConfig(head="lda", adaptation={"epochs": 2}).adaptation_config() == AdaptationConfig(epochs=2)
    for bad, field_name in [({"epochs": 0}, "epochs"), ({"on": "later"}, "on"),
                            ({"learning_rate": -1}, "learning_rate"),
                            ({"on": "adaptation_split"}, "per_class"), ({"per_class": 3}, "per_class"),
                            ({"epoch": 3}, "unknown field")]:
        with pytest.raises(ValueError, match=field_name):
            LoraBaselineConfig(head="lda", adaptation=bad)
    with pytest.raises(ValueError, match="statistics head"):
        LoraBaselineConfig(adaptation={"epochs": 2})  # the linear head
    with pytest.raises(ValueError, match="last_blocks needs freeze_backbone=False"):
        FinetuneConfig(freeze_backbone=True, last_blocks=1)


@pytest.mark.parametrize("config", [
    LoraBaselineConfig(head="lda", adaptation={"epochs": 2}),
    FinetuneConfig(last_blocks=1, head="ranpac", head_options={"projection_dim": 64}, adaptation={"epochs": 2}),
], ids=["lora", "lastblock"])
def test_adapt_then_accumulate_from_step_0_in_eval_mode(stream, config, tmp_path):
    """The adapter trains before the stream, then no gradient reaches it; the statistics head reads
    every task from its first step in eval mode (equal to one eval-mode pass, although dropout is on
    in training); save/load gives the same predictions and never adapts again."""
    model = get_cl_model(dropout_vit(), config)
    adapter = adapter_parameters(model)
    initial = [p.detach().clone() for p in adapter]
    settings = TrainingConfig(batch_size=8, learning_rate=1e-2, progress=False)
    trainer = ContinualTrainer(model, stream, settings, COLLATOR, make_accelerator(settings, cpu=True))
    adapted = {}
    original_prepare = trainer._train_experience

    def spy(task_id):  # the adapter's values when the stream starts
        if not adapted:
            adapted.update({i: p.detach().clone() for i, p in enumerate(adapter)})
        return original_prepare(task_id)

    trainer._train_experience = spy
    result = trainer.fit()
    assert result.finished
    assert any(not torch.equal(a, p) for a, p in zip(initial, adapted.values()))  # the adaptation trained it
    assert all(torch.equal(p, adapted[i]) and p.grad is None and not p.requires_grad for i, p in enumerate(adapter))
    assert_statistics_equal(model.head, eval_statistics(model, stream))
    record = model.config.adaptation_record
    assert record == {"on": "first_task", "task": "mnist/task0", "classes": stream[0].info["class_names"],
                      "examples": len(stream[0].train), "epochs": 2}
    assert "First-session adaptation: 32 examples, 2 epoch(s)" in history_markdown(model.config)
    # trained: the adapter plus the temporary head during adaptation, nothing during the stream
    trained = sum(p.numel() for p in adapter) + model.head.in_features * 2 + 2
    assert result.params["phases"] == {"adaptation": trained, "task 0": 0}
    assert result.params["trainable_params"] == trained and result.params["trainable_pct"] > 0

    model.save_pretrained(tmp_path / "adapter")
    reloaded = CLModel.from_pretrained(dropout_vit(), tmp_path / "adapter", is_trainable=True)  # to train it on
    assert reloaded.config.adaptation_record == record
    batch = COLLATOR([stream[1].test[i] for i in range(8)])
    model.eval(), reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**model_inputs(batch)).logits, model(**model_inputs(batch)).logits)
    # Trained again on the stream: frozen, not adapted a second time.
    names = {id(p): n for n, p in model.named_parameters()}
    named = dict(reloaded.named_parameters())
    again = [named[names[id(p)]] for p in adapter]
    before = [p.detach().clone() for p in again]
    assert all(p.requires_grad for p in again)  # loaded to train on: trainable until the engine freezes it
    rerun = ContinualTrainer(reloaded, stream, settings, COLLATOR, make_accelerator(settings, cpu=True))
    assert "adaptation" not in rerun.fit().records
    assert all(torch.equal(a, p) and not p.requires_grad for a, p in zip(before, again))


def test_adaptation_split_is_disjoint_from_stream_validation_and_test(stream):
    def keys(ds):
        return {ds[i]["image"].tobytes() for i in range(len(ds))}

    held, rest = carve_adaptation_split(stream[0], per_class=3, seed=0)
    assert sorted(held["label"]) == sorted(stream[0].classes * 3)
    assert len(held) + len(rest.train) == len(stream[0].train)
    others = keys(rest.train) | keys(stream[0].validation) | keys(stream[0].test)
    assert not keys(held) & others
    # The stream keeps its order (the carved rows are only left out).
    order = [stream[0].train[i]["image"].tobytes() for i in range(len(stream[0].train))]
    assert [order.index(k) for k in (rest.train[i]["image"].tobytes() for i in range(len(rest.train)))] == sorted(
        order.index(k) for k in keys(rest.train))
    with pytest.raises(ValueError, match="per_class=16"):
        carve_adaptation_split(stream[0], per_class=16, seed=0)

    trainer, result = fit(LoraBaselineConfig(head="prototype", adaptation={"on": "adaptation_split", "per_class": 3,
                                                                           "epochs": 1}), stream)
    assert trainer.model.config.adaptation_record["examples"] == 6
    assert trainer.model.head.counts.tolist() == [13, 13, 16, 16]  # task 0's stream lost the 3 carved per class


def test_statistics_are_read_again_when_the_routers_freeze(stream):
    """RwF training its routers through an LDA head on task 0, then freezing: the final statistics are
    exactly one eval-mode pass under the frozen routers (no router states mixed, no dropout), and the
    trainable count is what trained (the maximum), with the phases where it changed."""
    config = RwfConfig(num_prompts=4, head="lda", train_routers_for_tasks=1, head_refresh_steps=2)
    trainer, result = fit(config, stream)
    model = trainer.model
    assert model.trainable_parameters() == []
    assert_statistics_equal(model.head, eval_statistics(model, stream))
    routers = sum(p.numel() for p in model.method.routers.parameters())
    assert result.params["phases"] == {"task 0": routers, "task 1": 0}
    assert result.params["trainable_params"] == routers > 0


def test_feature_passes_of_the_bench_run_in_eval_mode(stream):
    """Feature caching and the probes' features: eval mode (no dropout) even on a model left in train
    mode by a trained task, and that mode given back."""
    backbone = dropout_vit().train()
    cached = encode(backbone, stream[0].train.select(range(8)), COLLATOR)
    assert backbone.training
    backbone.eval()
    with torch.no_grad():
        inputs = model_inputs(COLLATOR([stream[0].train[i] for i in range(8)]))
        expected = pooled_features(get_backbone_spec(backbone), backbone(**inputs), None)
    torch.testing.assert_close(torch.from_numpy(np.asarray(cached["features"])), expected)
    model = get_cl_model(dropout_vit(), LoraBaselineConfig(head="lda")).train()
    features, _ = model_features(model, stream[0].train, COLLATOR, limit=8)
    assert model.training
    model.eval()
    with torch.no_grad():
        again = model(**model_inputs(COLLATOR([stream[0].train[i] for i in range(8)]))).features
    torch.testing.assert_close(features, again)


_SCRIPT = """
import json, sys, torch
from transformers import ViTModel
from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import LoraBaselineConfig
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator
from hf_clroute.core.outputs import model_inputs

stream = class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=16,
                           test_per_class=8, name="mnist")
torch.manual_seed(0)
model = get_cl_model(ViTModel(tiny_vit_config()), LoraBaselineConfig(head="lda", adaptation={"epochs": 2}))
settings = TrainingConfig(batch_size=8, learning_rate=1e-2, progress=False)
accelerator = make_accelerator(settings)
result = ContinualTrainer(model, stream, settings, ImageCollator(16, num_channels=3), accelerator).fit()
collate = ImageCollator(16, num_channels=3)
batch = collate([stream[t].test[i] for t in range(2) for i in range(len(stream[t].test))])
model.eval()
with torch.no_grad():
    logits = model(**model_inputs(batch)).logits
if accelerator.is_main_process:
    json.dump({"processes": accelerator.num_processes, "predictions": logits.argmax(-1).tolist(),
               "counts": model.head.counts.tolist(), "R": result.accuracy_matrix}, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_two_processes_adapt_and_accumulate_like_one(tmp_path):
    """Under accelerate launch with 2 processes: the same adapter, statistics reduced exactly once
    (the same counts), the same predictions as one process."""
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(script), str(tmp_path / "one.json")], check=True, env=env, cwd=REPO)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", port]
    subprocess.run([*launch, str(script), str(tmp_path / "two.json")], check=True, env=env, cwd=REPO)
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert (one["processes"], two["processes"]) == (1, 2)
    assert one["counts"] == two["counts"] == [16.0] * 4
    # Same global batches, gradients averaged by DDP: equal up to float noise (a test example may flip
    # when two scores are within rounding of each other).
    agree = sum(a == b for a, b in zip(one["predictions"], two["predictions"])) / len(one["predictions"])
    assert agree >= 0.95
    assert sum(one["R"], []) == pytest.approx(sum(two["R"], []), abs=0.07)


def test_describe_record_is_empty_without_adaptation():
    assert describe_record(None) == ""


@pytest.mark.parametrize("method", ["aper-lora", "aper-vpt", "ranpac-lora", "rwf-fsa-ranpac", "rwf-fsa-slda",
                                    "apn-fsa-ranpac", "lastblock-fsa-ranpac", "mars-fsa-slda"])
def test_adaptation_rows_search_with_the_shared_budget(method, checked_search_grid):
    grid = checked_search_grid(method)  # 12 distinct points, each resolving to a run with its values
    assert any("config.adaptation.epochs" in point for point in grid)


def test_a_non_finite_adaptation_stops_before_the_stream(stream):
    """First-session adaptation runs under the same guard as the stream: a NaN loss stops it at its step."""
    from hf_clroute.errors import NonFiniteTrainingError

    class NaNPixels:
        def __call__(self, examples):
            batch = COLLATOR(examples)
            batch["pixel_values"] = torch.full_like(batch["pixel_values"], float("nan"))
            return batch

    model = get_cl_model(dropout_vit(), LoraBaselineConfig(head="lda", adaptation={"epochs": 2}))
    settings = TrainingConfig(batch_size=8, learning_rate=1e-2, progress=False, max_grad_norm=1.0)
    trainer = ContinualTrainer(model, stream, settings, NaNPixels(), make_accelerator(settings, cpu=True))
    with pytest.raises(NonFiniteTrainingError, match=r"first-session adaptation stopped at step 1 .*lora"):
        trainer.fit()
    assert trainer.result.records.get("adaptation") is None  # it never finished


def test_a_frozen_adapter_scores_from_test_features_computed_once(stream):
    """After first-session adaptation a LoRA adapter is frozen: its features are a fixed function of the input,
    so each test split is encoded once and scored from then on, with the same accuracies as encoding it at every
    evaluation (the cache off)."""
    config = LoraBaselineConfig(head="lda", adaptation={"epochs": 2})
    cached_trainer, cached = fit(config, stream, evals_per_task=3)
    model = cached_trainer.model
    assert model.reads_fixed_features() and not model.reads_frozen_features()  # the bare backbone's cache: no
    assert set(cached_trainer._frozen_features) == {0, 1}
    plain_trainer, plain = fit(LoraBaselineConfig(head="lda", adaptation={"epochs": 2}), stream, evals_per_task=3,
                               eval_cache_examples=0)
    assert not plain_trainer._frozen_features
    np.testing.assert_allclose(cached.accuracy_matrix, plain.accuracy_matrix, atol=1e-9)
    np.testing.assert_allclose(cached.anytime, plain.anytime, atol=1e-9)
    # a LoRA that still trains reads features that change: nothing is cached
    online = get_cl_model(dropout_vit(), LoraBaselineConfig())
    assert not online.reads_fixed_features()


@pytest.mark.parametrize("kind", ["rwf", "apn"])
def test_our_frozen_adapters_score_from_test_features_computed_once(stream, kind):
    """RwF's routers and APN's patch FFNs, frozen after first-session adaptation, are fixed functions in eval
    mode (``FixedInEval``): their test features are encoded once, with the same scores as encoding them at every
    evaluation. A router tensor that moves (it lies outside the backbone) makes the kept features stale."""
    from hf_clroute.methods.apn import ApnConfig

    def config():
        if kind == "rwf":
            return RwfConfig(num_prompts=4, head="lda", adaptation={"epochs": 2})
        return ApnConfig(num_patches=4, top_k=2, rank=2, head="lda", adaptation={"epochs": 2})

    cached_trainer, cached = fit(config(), stream, evals_per_task=3)
    model = cached_trainer.model
    assert model.reads_fixed_features() and not model.reads_frozen_features()
    assert set(cached_trainer._frozen_features) == {0, 1}
    plain_trainer, plain = fit(config(), stream, evals_per_task=3, eval_cache_examples=0)
    assert not plain_trainer._frozen_features
    np.testing.assert_allclose(cached.accuracy_matrix, plain.accuracy_matrix, atol=1e-9)
    np.testing.assert_allclose(cached.anytime, plain.anytime, atol=1e-9)
    # the same module while it trains (online, no adaptation) is not counted
    online = get_cl_model(dropout_vit(), RwfConfig(num_prompts=4) if kind == "rwf" else ApnConfig(num_patches=4))
    assert not online.reads_fixed_features()
    # a tensor the features read moves: the next evaluation encodes the test splits again
    moved = next(iter(model.method.parameters())) if kind == "rwf" else next(
        p for n, p in model.backbone.named_parameters() if "patches" in n)
    before = model.features_fingerprint()
    with torch.no_grad():
        moved.add_(1.0)
    assert not torch.equal(model.features_fingerprint(), before)
    kept = cached_trainer._frozen_features[0]
    cached_trainer.evaluate_row(1)
    assert cached_trainer._frozen_features[0] is not kept
