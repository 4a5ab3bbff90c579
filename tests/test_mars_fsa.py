"""MaRS's slot memory as the first-session adaptation module under a statistics head (``mars-fsa-slda``):
the memory trains before the stream with DCDA and a temporary linear head, then is a fixed function
h -> h~ (no gradient, no SGSE growth, no teacher or statistics bookkeeping) whose output the LDA head
accumulates; save/load; the config's refusals; the settings row.

Synthetic streams of *features* as in test_mars.py (domains in orthogonal subspaces, so a memory that
still trained would grow at every new domain); each test runs in a few seconds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from test_mars import D, tiny_vit

from hf_clroute import CLModel, ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.bench.harness.feature_cache import FeatureCollator
from hf_clroute.data.experiences import Experience
from hf_clroute.engine import make_accelerator
from hf_clroute.engine.first_session import adapter_parameters
from hf_clroute.methods.mars import MarsConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


def feature_stream(
    n_domains: int, train_per_class: int = 30, test_per_class: int = 10, seed: int = 0
) -> list[Experience]:
    """Class-incremental: task k = domain k (axes 4k..4k+3) with classes 2k and 2k+1 (sign of axis 4k+1)."""
    rng = np.random.default_rng(seed)
    stream = []
    for k in range(n_domains):
        splits = {}
        for split, n in (("train", train_per_class), ("test", test_per_class)):
            feats = rng.normal(0.0, 0.3, (2 * n, D)).astype(np.float32)
            labels = np.repeat([2 * k, 2 * k + 1], n)
            feats[:, 4 * k] += 4.0
            feats[:, 4 * k + 1] += np.where(labels % 2 == 0, 2.0, -2.0)
            order = rng.permutation(len(labels))
            splits[split] = Dataset.from_dict({"features": feats[order], "label": labels[order].tolist()})
        stream.append(Experience(k, f"domain{k}", [2 * k, 2 * k + 1], splits["train"], splits["test"]))
    return stream


def fsa_config(**overrides) -> MarsConfig:
    """A small memory adapted for 2 epochs on task 0, read by a streaming-LDA head. top_similarity: SGSE
    fires at every new (orthogonal) domain when the memory still trains (the control in test (a))."""
    return MarsConfig(**{"num_slots": 4, "max_slots": 16, "dcda_window": 2, "novelty_statistic": "top_similarity",
                         "head": "lda", "head_options": {"shrinkage": 1e-4}, "adaptation": {"epochs": 2},
                         **overrides})


def trainer_for(model: CLModel, stream) -> ContinualTrainer:
    training = TrainingConfig(batch_size=10, learning_rate=1e-2, progress=False)
    return ContinualTrainer(model, stream, training, FeatureCollator(), make_accelerator(training, cpu=True))


def features_of(experience_split: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    batch = FeatureCollator()([experience_split[i] for i in range(len(experience_split))])
    return batch["features"], batch["labels"]


@torch.no_grad()
def eval_logits(model: CLModel, stream) -> torch.Tensor:
    model.eval()
    features = torch.cat([features_of(e.test)[0] for e in stream])
    return model(features=features).logits


@pytest.fixture(scope="module")
def stream():
    return feature_stream(3)


@pytest.fixture(scope="module")
def adapted(stream):
    """(model, result, memory state and slot count when the stream started, stages the adaptation ran)."""
    model = get_cl_model(tiny_vit(), fsa_config())
    method = model.method
    trainer = trainer_for(model, stream)
    at_start: dict = {}
    stages: list[int] = []
    stage, train_experience = method.stage, trainer._train_experience

    def spy_stage() -> int:
        stages.append(stage())
        return stages[-1]

    def spy_start(task_id):  # the memory as the adaptation left it, before the stream's first task
        if not at_start:
            at_start.update(params={n: p.detach().clone() for n, p in method.memory.named_parameters()},
                            slots=method.memory.num_slots, state=method.extra_state(), stages=len(stages))
        return train_experience(task_id)

    method.stage = spy_stage
    trainer._train_experience = spy_start
    result = trainer.fit()
    del method.stage
    return model, result, at_start, stages


def test_memory_trains_in_the_adaptation_then_stays_fixed(adapted, stream):
    """(a) The adaptation runs DCDA as on one task (keys seeded from the data, both stages), then no memory
    parameter gets a gradient or moves during the stream, SGSE adds no slot and no hook keeps book."""
    model, result, at_start, stages = adapted
    method = model.method
    assert result.finished and model.config.adaptation_record["examples"] == len(stream[0].train)
    steps = result.records["adaptation"]["steps"]
    assert steps == 2 * len(stream[0].train) // 10
    # The adaptation: every step one DCDA stage, both stages run; the phase's hooks ran on every step.
    assert at_start["stages"] == len(stages) == steps and set(stages) == {1, 2}
    assert at_start["state"]["keys_seeded"] == 4 and at_start["state"]["steps_seen"] == steps
    fresh = get_cl_model(tiny_vit(), fsa_config()).method.memory
    assert not torch.equal(fresh.gamma, at_start["params"]["gamma"])  # stage 1 trained the adapters
    # The stream: frozen, untouched; no slot growth, no teacher, no statistics, no task counted.
    assert adapter_parameters(model) == [] and method.fixed
    for name, param in method.memory.named_parameters():
        assert not param.requires_grad and param.grad is None, name
        assert torch.equal(param, at_start["params"][name]), name
    assert method.memory.num_slots == at_start["slots"]
    assert method.extra_state() == at_start["state"]
    # The only teacher is the adaptation's temporary head at its start (task 0: nothing old to keep).
    assert method.teacher_weight.shape[0] == method.teacher_classes == 2 and method.old_classes == 0
    assert method.task_start_history == [[0, 0]]
    assert result.params["phases"]["task 0"] == 0


def test_the_same_memory_would_grow_if_it_kept_training(stream):
    """Control for (a): through the stream with the linear head (no adaptation), SGSE adds slots on
    this stream, so "no growth" above is the freeze, not a quiet stream."""
    config = fsa_config(head="linear", head_options={}, adaptation=None)
    model = get_cl_model(tiny_vit(), config)
    trainer_for(model, stream).fit()
    assert model.method.memory.num_slots > config.num_slots and model.method.expansion_history


@torch.no_grad()
def test_lda_statistics_are_one_eval_pass_of_the_memory_output(adapted, stream):
    """(b) The head's counts are the stream's training examples (task 0 included) and its sums / second
    moment those of h~ = memory(h), computed here from the cached features outside the engine."""
    model, *_ = adapted
    head, memory = model.head, model.method.memory
    memory.eval()
    features, labels = (torch.cat(parts) for parts in zip(*(features_of(e.train) for e in stream)))
    h_tilde = memory(features).output.double()
    assert not torch.allclose(h_tilde, F.layer_norm(features, (D,)).double(), atol=1e-3)  # the adapted memory
    counts = torch.bincount(labels, minlength=head.num_classes).double()
    assert head.counts.tolist() == counts.tolist() == [30.0] * 6
    means = torch.stack([h_tilde[labels == c].mean(0) for c in range(head.num_classes)])
    torch.testing.assert_close(head.sums / head.counts.unsqueeze(1), means, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(head.second_moment, h_tilde.T @ h_tilde, rtol=1e-6, atol=1e-6)


def test_save_load_gives_identical_logits_and_is_not_adapted_again(adapted, stream, tmp_path):
    """(c) save_pretrained / from_pretrained: the same slots, state and logits; trained on again, the
    reloaded memory is frozen (not adapted a second time) and keeps its slots."""
    model, *_ = adapted
    model.save_pretrained(tmp_path / "adapter")
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path / "adapter")
    assert loaded.config.adaptation_record == model.config.adaptation_record
    assert loaded.method.memory.num_slots == model.method.memory.num_slots
    assert loaded.method.extra_state() == model.method.extra_state()
    torch.testing.assert_close(eval_logits(loaded, stream), eval_logits(model, stream), rtol=0, atol=0)
    before = {n: p.detach().clone() for n, p in loaded.method.memory.named_parameters()}
    again = trainer_for(loaded, stream[:1]).fit()
    assert "adaptation" not in again.records and loaded.method.fixed
    assert all(torch.equal(p, before[n]) for n, p in loaded.method.memory.named_parameters())
    assert loaded.method.memory.num_slots == model.method.memory.num_slots


def test_a_statistics_head_needs_adaptation_naming_the_field():
    """(d) DCDA trains through the linear head: a statistics head only with adaptation, which trains the
    memory (so not with use_stage1=False); a memory still training refuses a statistics head."""
    for head in ("lda", "ranpac", "prototype"):
        with pytest.raises(ValueError, match=rf"MarsConfig.head='{head}' needs MarsConfig.adaptation"):
            MarsConfig(head=head)
    with pytest.raises(ValueError, match="MarsConfig.adaptation trains the memory, which use_stage1=False"):
        fsa_config(use_stage1=False)
    with pytest.raises(ValueError, match="statistics head"):  # CLConfig: adaptation needs a statistics head
        fsa_config(head="linear", head_options={})
    model = get_cl_model(tiny_vit(), fsa_config())  # not adapted yet: the memory trains, the head is LDA
    model.train()
    with pytest.raises(ValueError, match="linear head"):
        model(features=torch.randn(4, D), labels=torch.tensor([0, 1, 0, 1]))


def test_settings_row_resolves_for_split_mnist():
    """(e) The row: MaRS with mars-paper's memory (the first reading, as the row was measured), the LDA
    head, adaptation on the first task for 5 epochs, control slda; the tuner's 12 points (the shared
    learning rates x the adaptation's epochs) each resolve to a run with their values (a nested key, so
    through the tuner's ``selected``)."""
    from hf_clroute.bench.harness.settings import method_file, method_variants, resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig
    from hf_clroute.bench.runners.tune import BUDGET, LEARNING_RATES, search_grid, selected

    suite = SuiteConfig.load("split-mnist")
    run = resolve_run(suite, "mars-fsa-slda", 0)
    config = run.adapter_config
    assert run.registered_method == "mars" and isinstance(config, MarsConfig)
    assert (config.head, config.head_options) == ("lda", {"shrinkage": 1e-4})
    assert config.adaptation_config().on == "first_task" and config.adaptation_config().epochs == 5
    assert (config.num_slots, config.max_slots, config.dcda_window) == (32, 64, 1)  # mars.json's, through mars-paper
    assert run.sources["config.head"] == "configs/variants/mars-fsa-slda.json"
    data = method_file("mars-fsa-slda")
    assert data["control"] == "slda" and method_file("slda") and "(ours)" in data["description"]
    assert ("mars-fsa-slda", "mars-paper") in method_variants()
    grid = search_grid("mars-fsa-slda", trains=True)
    assert len({tuple(sorted(p.items())) for p in grid}) == len(grid) == BUDGET
    assert {p["config.adaptation.epochs"] for p in grid} == {1, 3, 5, 10}
    for point in grid:
        tuned = resolve_run(suite, "mars-fsa-slda", 0, selected=selected(point, config))
        adaptation = tuned.adapter_config.adaptation_config()
        assert (adaptation.on, adaptation.epochs) == ("first_task", point["config.adaptation.epochs"])
        assert tuned.adapter_config.head == "lda"
        assert tuned.training.learning_rate == point["training.learning_rate"] in LEARNING_RATES


@pytest.mark.slow
def test_row_runs_end_to_end_on_a_quick_tiny_suite(tiny_suite, tmp_path):
    """(e) `hf-clroute bench --quick` with the row on the tiny MNIST suite: cached features, adapted
    memory, the LDA head over both tasks."""
    from hf_clroute.cli import main

    out = tmp_path / "out"
    assert main(["bench", "--suite", str(tiny_suite), "--methods", "mars-fsa-slda", "--seeds", "0", "--quick",
                 "--out", str(out), "--no-progress"]) == 0
    row = json.loads((out / "results.json").read_text())["methods"]["mars-fsa-slda"]
    assert row["features_cached"] and len(row["accuracy_matrix"]) == 2
    assert row["trainable_params"] > 0
