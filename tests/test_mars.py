"""MaRS: slot memory, SGSE (statistics, behaviour, timing against task boundaries), DCDA stages,
the paper's slot anchors (per-slot EMA statistics), growth through SGSE alone by default, the
variants (class-Gaussian anchors with bounded distillation, keys at task starts), save/load/continue.

Synthetic streams of *features* (the bench caches frozen features for MaRS the
same way) keep the engine tests fast; domains live in orthogonal subspaces so
"novel" is unambiguous. Every stream is seeded.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import BertModel, ViTModel

from hf_clroute import CLModel, ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_bert_config, tiny_vit_config
from hf_clroute.bench.harness.feature_cache import FeatureCollator
from hf_clroute.data.experiences import Experience
from hf_clroute.engine import make_accelerator
from hf_clroute.methods.mars import ExpansionTest, MarsConfig, SlotMemory, wilson_lower_bound
from hf_clroute.methods.mars.class_statistics import ClassStatistics
from hf_clroute.methods.mars.method import distillation
from hf_clroute.methods.mars.sgse import binomial_cdf, expansion_timing, threshold_for_alpha
from hf_clroute.methods.mars.slot_statistics import SlotStatistics

D = 32  # tiny_vit_config hidden size


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


def tiny_vit() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config())


# ---- synthetic feature streams -------------------------------------------------------------


def domain_features(domain: int, label: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Domain k lives on axes 4k..4k+3 (orthogonal to every other domain); its two classes
    differ in the sign of the second axis."""
    x = rng.normal(0.0, 0.3, (n, D))
    x[:, 4 * domain] += 4.0
    x[:, 4 * domain + 1] += 2.0 if label % 2 == 0 else -2.0
    return x.astype(np.float32)


def feature_stream(
    n_domains: int, train_per_class: int = 40, test_per_class: int = 10, seed: int = 0
) -> list[Experience]:
    """Class-incremental: task k = domain k with classes 2k and 2k+1."""
    rng = np.random.default_rng(seed)
    stream = []
    for k in range(n_domains):
        splits = {}
        for split, n in (("train", train_per_class), ("test", test_per_class)):
            feats = np.concatenate([domain_features(k, c, n, rng) for c in (0, 1)])
            labels = np.repeat([2 * k, 2 * k + 1], n)
            order = rng.permutation(len(labels))
            splits[split] = Dataset.from_dict({"features": feats[order], "label": labels[order].tolist()})
        stream.append(Experience(k, f"domain{k}", [2 * k, 2 * k + 1], splits["train"], splits["test"]))
    return stream


def small_config(**overrides) -> MarsConfig:
    """The defaults (the paper's: slot anchors, growth through SGSE alone) on a small memory."""
    return MarsConfig(**{"num_slots": 4, "max_slots": 16, "dcda_window": 2, **overrides})


def gaussian_config(**overrides) -> MarsConfig:
    """Our class-Gaussian anchor variant (mars-gaussian-align)."""
    return small_config(**{"anchors": "class_gaussian", **overrides})


def fit(config: MarsConfig, stream, model: CLModel | None = None, resume_from=None, **training):
    training = TrainingConfig(**{"batch_size": 10, "learning_rate": 1e-2, "progress": False, **training})
    model = model or get_cl_model(tiny_vit(), config)
    trainer = ContinualTrainer(model, stream, training, FeatureCollator(), make_accelerator(training, cpu=True))
    return model, trainer.fit(resume_from=resume_from)


@torch.no_grad()
def eval_logits(model: CLModel, stream) -> torch.Tensor:
    model.eval()
    batch = FeatureCollator()([e for exp in stream for e in exp.test])
    return model(features=batch["features"])


# ---- slot memory ---------------------------------------------------------------------------------


def test_identity_init_leaves_features_unchanged_up_to_layernorm():
    model = get_cl_model(tiny_vit(), MarsConfig(num_slots=8, max_slots=16))
    pixels = torch.rand(5, 3, 16, 16)
    h = model.extract_features({"pixel_values": pixels})
    routing = model.method.memory(h)
    torch.testing.assert_close(routing.output, F.layer_norm(h, (D,)), rtol=0, atol=1e-5)
    # Routing is a distribution over the active slots only.
    assert routing.probs[:, 8:].abs().max() == 0
    torch.testing.assert_close(routing.probs.sum(-1), torch.ones(5))
    # A new slot is an identity adapter too: still LN(h).
    model.method.memory.add_slot(torch.randn(D))
    torch.testing.assert_close(model.method.memory(h).output, F.layer_norm(h, (D,)), rtol=0, atol=1e-5)


def test_bert_backbone_through_the_core_api():
    """On BERT the memory reads the attention-mask-weighted mean of the last hidden states (padding
    ignored, not the CLS token) and the head classifies the memory's output h~."""
    torch.manual_seed(0)
    bert = BertModel(tiny_bert_config()).eval()
    model = get_cl_model(copy.deepcopy(bert), MarsConfig(num_slots=4))
    model.grow_head(3)
    with torch.no_grad():
        model.method.memory.beta[:4] += torch.randn(4, D)  # adapters that are not the identity
    ids = torch.randint(1, 100, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # the second text is two tokens shorter
    model.eval()
    logits = model(input_ids=ids, attention_mask=mask).logits
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        h = (hidden * weights).sum(1) / weights.sum(1)
        expected = model.head(model.method.memory(h).output)
    torch.testing.assert_close(logits, expected)
    assert not torch.allclose(logits, model.head(model.method.memory(hidden[:, 0]).output).detach())
    padded = ids.clone()
    padded[1, 5:] = 3  # what sits under the padding changes nothing
    torch.testing.assert_close(model(input_ids=padded, attention_mask=mask).logits, logits)


# ---- SGSE statistics --------------------------------------------------------------------------------


def wilson_reference(successes: int, n: int, z: float) -> float:
    """The smaller root p of (p_hat - p)^2 = z^2 p (1 - p) / n (the Wilson interval's definition)."""
    p_hat = successes / n
    a = 1 + z * z / n
    roots = np.roots([a, -(2 * p_hat + z * z / n), p_hat * p_hat])
    return float(min(roots.real))


@pytest.mark.parametrize("successes,n", [(0, 20), (3, 20), (15, 20), (19, 20), (20, 20), (7, 13), (48, 100)])
def test_wilson_bound_matches_reference(successes, n):
    expected = max(0.0, wilson_reference(successes, n, 1.645))
    assert wilson_lower_bound(successes, n, 1.645) == pytest.approx(expected, abs=1e-12)


def test_wilson_bound_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k in range(21):
        # A two-sided 90% Wilson interval's lower end is the one-sided 95% bound (z = 1.6449).
        low = stats.binomtest(k, 20).proportion_ci(confidence_level=0.90, method="wilson").low
        assert wilson_lower_bound(k, 20, 1.6448536269514722) == pytest.approx(low, abs=1e-9)


def test_threshold_for_alpha_is_the_largest_valid_one():
    threshold, rate = threshold_for_alpha(20, 1.645, 0.9, 0.05)
    expands = [k for k in range(21) if wilson_lower_bound(k, 20, 1.645) < threshold]
    assert expands == list(range(max(expands) + 1))
    assert rate == pytest.approx(binomial_cdf(max(expands), 20, 0.9)) and rate <= 0.05
    assert binomial_cdf(max(expands) + 1, 20, 0.9) > 0.05  # one more success count would break alpha
    with pytest.raises(ValueError, match="alpha"):
        threshold_for_alpha(20, 1.645, 0.9, 1e-30)


def stationary_confidences(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "router":  # a data-seeded slot memory on a stationary mixture of 3 clusters
        memory = SlotMemory(D, num_slots=16, max_slots=16)
        centres = rng.normal(0.0, 3.0, (3, D))
        def draw(m):
            return torch.tensor(centres[rng.integers(0, 3, m)] + rng.normal(0, 1.0, (m, D)), dtype=torch.float32)
        with torch.no_grad():
            for i, q in enumerate(memory.query(draw(16))):
                memory.set_key(i, q)
            return memory(draw(n)).confidence.numpy()
    if kind == "skewed":  # most inputs well covered, a tail of less certain ones
        return 1.0 - rng.exponential(0.05, n)
    return rng.normal(0.5, 0.1, n)


@pytest.mark.parametrize("kind", ["router", "skewed", "normal"])
def test_false_expansion_rate_on_stationary_stream_is_at_most_alpha(kind):
    alpha, n_tests = 0.05, 2000
    test = ExpansionTest(4, alpha=alpha)
    rng = np.random.default_rng(0)
    for s in stationary_confidences(kind, n_tests * test.trials + test.window, rng):
        test.observe(float(s))
    assert test.tests >= 0.95 * n_tests
    rate = test.expansions / test.tests
    # The per-test bound from the binomial computation, and the measured rate, both <= alpha.
    assert test.false_expansion_bound <= alpha
    assert rate <= alpha, f"{kind}: {test.expansions} false expansions in {test.tests} tests"


DETECTION_DELAY = 40  # = 2n trials: the block the shift falls in, plus the next one


@pytest.mark.parametrize("seed", range(20))
def test_abrupt_shift_expands_within_two_blocks(seed):
    rng = np.random.default_rng(seed)
    test = ExpansionTest(3)
    start = int(rng.integers(300, 320))  # the shift lands anywhere within a block
    for s in rng.normal(0.8, 0.05, start):
        test.observe(float(s), torch.tensor([1.0, 0.0, 0.0]))
    before = test.expansions
    novel = torch.tensor([0.0, 1.0, 0.0])
    for delay, s in enumerate(rng.normal(0.4, 0.05, DETECTION_DELAY), start=1):
        if test.observe(float(s), novel):
            break
    assert test.expansions == before + 1, "no expansion within 2n trials of the shift"
    assert delay <= DETECTION_DELAY
    # The new key is the mean query of the block's low-confidence inputs: mostly post-shift ones.
    assert float(test.new_key @ novel) > 0.8


def test_sgse_state_round_trip_continues_identically():
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.normal(0.8, 0.05, 137), rng.normal(0.3, 0.05, 200)])
    a, b = ExpansionTest(2), ExpansionTest(2)
    for s in values[:137]:
        a.observe(float(s), torch.ones(2))
    b.load_state(a.state())
    b.pool.copy_(a.pool)
    decisions = [(a.observe(float(s), torch.ones(2)), b.observe(float(s), torch.ones(2))) for s in values[137:]]
    assert all(x == y for x, y in decisions) and any(x for x, _ in decisions)
    assert a.state() == b.state()


# ---- the method on the engine --------------------------------------------------------------------


def test_slot_growth_is_bounded_by_novel_domains():
    n_domains = 5
    config = small_config(keys_per_task=0)  # SGSE alone adds slots
    model, result = fit(config, feature_stream(n_domains))
    history = model.method.extra_state()["slot_history"]
    final = model.method.memory.num_slots
    # Each new domain is novel once: S_0 + N plus a margin of 2 for false expansions.
    # (Domain 0 seeds the S_0 keys, so N = n_domains - 1 novel domains follow.)
    assert config.num_slots + 1 <= final <= config.num_slots + (n_domains - 1) + 2, history
    assert history[0] == [0, config.num_slots] and history[-1][1] == final
    assert [n for _, n in history] == sorted(n for _, n in history)
    assert result.accuracy_matrix[-1][-1] >= 0.5  # the newest domain is learnt (chance: 0.1)


def test_no_sgse_ablation_keeps_slots_fixed():
    # Nothing else adds slots by default: no keys at task starts.
    model, _ = fit(small_config(use_sgse=False), feature_stream(3, train_per_class=20))
    assert model.method.memory.num_slots == 4 and model.method.extra_state()["slot_history"] == [[0, 4]]


def test_default_memory_grows_through_sgse_alone():
    """The paper's claim is task-free growth: by default every slot added after the initial ones
    is an SGSE expansion, none is keyed at a task start (the stream has 3 boundaries)."""
    model, _ = fit(small_config(), feature_stream(4))
    state = model.method.extra_state()
    assert state["slot_history"][1:] == state["expansion_history"] and state["expansion_history"]
    assert model.method.memory.num_slots == 4 + len(state["expansion_history"])
    assert state["keys_seeded"] == 4 and state["task_keys_left"] == 0


def test_slot_cap_warns_and_stops_growing():
    with pytest.warns(UserWarning, match="max_slots=5"):
        model, _ = fit(small_config(max_slots=5), feature_stream(3))
    assert model.method.memory.num_slots == 5
    assert model.method.extra_state()["skipped_expansions"] >= 1


def test_save_load_and_continue_equals_not_stopping(tmp_path):
    stream = feature_stream(4)
    config = small_config()
    full_model, full = fit(config, stream, eval_every=4)
    # Stop mid-task 2 (of 0..3); the run continues from the checkpoint in a new process-like object.
    ckpt = tmp_path / "ckpt"
    _, partial = fit(
        small_config(), stream, eval_every=4, checkpoint_dir=str(ckpt), checkpoint_every=4, stop_after_steps=21
    )
    assert not partial.finished
    resumed_model, resumed = fit(
        small_config(), stream, eval_every=4, checkpoint_dir=str(ckpt), checkpoint_every=4, resume_from=ckpt
    )
    full_history = full_model.method.extra_state()["slot_history"]
    assert any(step > 20 for step, _ in full_history[1:]), "the test needs an expansion after the stop"
    assert resumed_model.method.extra_state() == full_model.method.extra_state()
    assert resumed.accuracy_matrix == full.accuracy_matrix
    torch.testing.assert_close(eval_logits(resumed_model, stream), eval_logits(full_model, stream), rtol=0, atol=0)
    # save_pretrained / from_pretrained: the same slots, statistics and outputs.
    full_model.save_pretrained(tmp_path / "adapter")
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path / "adapter")
    assert loaded.method.memory.num_slots == full_model.method.memory.num_slots
    assert loaded.method.extra_state() == full_model.method.extra_state()
    for name in ("mass", "sums"):
        torch.testing.assert_close(getattr(loaded.method.slot_stats, name), getattr(full_model.method.slot_stats, name),
                                   rtol=0, atol=0)
    torch.testing.assert_close(eval_logits(loaded, stream), eval_logits(full_model, stream), rtol=0, atol=0)


# ---- DCDA stages -------------------------------------------------------------------------------------


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> set[str]:
    return {k for k, v in module.named_parameters() if not torch.equal(before[k], v)}


def test_stage1_never_changes_head_and_stage2_never_changes_memory():
    """The engine's step (one AdamW over everything), alternating every step, after both
    groups have Adam momentum: the inactive group must not move at all."""
    stream = feature_stream(2, train_per_class=10)
    model, _ = fit(small_config(dcda_window=1), stream[:1])  # task 0 done: a teacher exists next
    method = model.method
    model.grow_head(4)  # as the engine does: grow, then on_task_start
    method.on_task_start(model, stream[1], _ctx())
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2, weight_decay=0.1)
    batches = [FeatureCollator()([stream[1].train[i] for i in range(j, j + 5)]) for j in range(0, 20, 5)]
    model.train()
    for batch in batches * 2:
        stage = method.stage()
        before_head, before_memory = snapshot(model.head), snapshot(method.memory)
        out = model(**batch)  # the engine's step: one call, the loss inside
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        method.after_step(model, batch, out, _ctx())
        if stage == 1:
            assert not changed(before_head, model.head) and changed(before_memory, method.memory)
        else:
            assert not changed(before_memory, method.memory) and changed(before_head, model.head)
    assert method.extra_state()["old_classes"] == 2


def test_sequential_schedule_runs_stage1_then_stage2():
    stream = feature_stream(1, train_per_class=20)
    model = get_cl_model(tiny_vit(), small_config(dcda_schedule="sequential", stage1_fraction=0.25))
    stages = []
    original = model.method.after_step

    def record(*args, **kwargs):
        stages.append(model.method.stage())
        original(*args, **kwargs)

    model.method.after_step = record
    fit(None, stream, model=model, epochs=2)  # offline: 2 epochs x 4 steps
    # Recorded before the step's counters advance: the first 25% of the 80 samples is stage 1.
    assert stages == [1, 1, 2, 2, 2, 2, 2, 2]


def _ctx():
    from hf_clroute.core.method import StepContext

    return StepContext(task_id=1)


@pytest.mark.parametrize(
    "field,value",
    [("num_slots", 0), ("max_slots", 2), ("tau_r", -1.0), ("alpha", 1.5), ("dcda_schedule", "both"),
     ("key_init", "zeros"), ("lambda_smooth", -0.1), ("freeze_backbone", False), ("class_stats_space", "pixels"),
     ("anchors_per_class", 0), ("covariance_shrinkage", 1.5), ("lambda_align", -1.0), ("keys_per_task", -1),
     ("timing_window", 0), ("novelty_statistic", "entropy"), ("anchors", "class"), ("stat_horizon", 0),
     ("varsigma", 0.0), ("stage2_ratio", 0), ("full_output_consistency", "all"), ("anchor_memory", "bank")],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MarsConfig(**{"num_slots": 4, "max_slots": 8, field: value})


def test_config_needs_a_stage():
    with pytest.raises(ValueError, match="use_stage1"):
        MarsConfig(use_stage1=False, use_stage2=False)


def test_defaults_are_the_papers():
    c = MarsConfig()
    assert (c.num_slots, c.tau_r, c.quantile_beta, c.quantile_window, c.quantile_eps) == (32, 0.07, 0.9, 10, 0.1)
    assert (c.test_trials, c.wilson_z, c.lambda_smooth, c.distill_temperature) == (20, 1.645, 0.3, 3.0)
    assert math.isclose(ExpansionTest(2).false_expansion_bound, binomial_cdf(15, 20, 0.9))
    # Task-free growth and the per-slot anchors; our designs are opt-in variants.
    assert (c.keys_per_task, c.anchors, c.use_sgse, c.use_anchors) == (0, "slot", True, True)


def _into_second_task(config, stream, stage: int | None = None):
    """A model fitted on the first task, its head grown to 4 classes and the second task begun,
    in train mode (advanced to DCDA ``stage`` when given); returns (model, method)."""
    model, _ = fit(config, stream[:1])
    method = model.method
    model.grow_head(4)
    method.begin_task(model, stream[1], _ctx())
    while stage is not None and method.stage() != stage:
        method.task_step += 1
    model.train()
    return model, method


def test_current_task_loss_reaches_the_stage2_head_loss():
    """Stage 2's CE is the base loss: with current_task_loss the old classes' head rows get
    gradient only from the distillation terms, not from the CE on new samples."""
    stream = feature_stream(2, train_per_class=10)
    for current_task_loss in (True, False):
        model, method = _into_second_task(small_config(dcda_window=1, current_task_loss=current_task_loss), stream, 2)
        batch = FeatureCollator()([stream[1].train[i] for i in range(6)])
        model(**batch).losses["ce"].backward()
        assert (model.head.weight.grad[:2].abs().sum() == 0) == current_task_loss
        assert model.head.weight.grad[2:].abs().sum() > 0


# ---- anchors: running class statistics ------------------------------------------------------------


def test_class_statistics_equal_a_batch_fit():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (90, 5)) + np.repeat(rng.normal(0, 3, (3, 5)), 30, axis=0)
    y = np.repeat([0, 2, 3], 30)  # class 1 never seen
    order = rng.permutation(90)
    x, y = x[order], y[order]
    stats = ClassStatistics(5)
    for i in range(0, 90, 7):  # streamed in uneven batches
        stats.update(torch.tensor(x[i : i + 7], dtype=torch.float32), torch.tensor(y[i : i + 7]))
    x32 = torch.tensor(x, dtype=torch.float32).double().numpy()  # what the stream carried
    assert stats.seen().tolist() == [0, 2, 3]
    means = {c: x32[y == c].mean(0) for c in (0, 2, 3)}
    pooled = sum((x32[y == c] - means[c]).T @ (x32[y == c] - means[c]) for c in means) / (90 - 3)
    for c, mean in means.items():
        np.testing.assert_allclose(stats.means()[c].numpy(), mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.covariance().numpy(), pooled, rtol=0, atol=1e-10)


def test_anchors_are_drawn_from_the_stored_gaussians():
    stats = ClassStatistics(3)
    rng = np.random.default_rng(1)
    cov = np.array([[1.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 0.5]])
    centres = np.array([[0.0, 0.0, 0.0], [5.0, -3.0, 1.0]])
    for c in (0, 1):
        stats.update(torch.tensor(rng.multivariate_normal(centres[c], cov, 4000)), torch.full((4000,), c))
    samples, labels = stats.sample(torch.tensor([0, 1]), 20000, 0.0, torch.Generator().manual_seed(0))
    assert labels.bincount().tolist() == [20000, 20000]
    for c in (0, 1):
        drawn = samples[labels == c].double()
        torch.testing.assert_close(drawn.mean(0), stats.means()[c], rtol=0, atol=0.05)
        torch.testing.assert_close(torch.cov(drawn.T), stats.covariance(), rtol=0, atol=0.06)
    # Shrinkage moves the covariance towards tr/d * I, keeping the trace.
    shrunk = stats.sampler(0.5) @ stats.sampler(0.5).T
    torch.testing.assert_close(torch.trace(shrunk), torch.trace(stats.covariance()), rtol=1e-6, atol=1e-6)


def test_stage2_anchors_come_from_the_method_statistics():
    stream = feature_stream(2, train_per_class=20)
    model, _ = fit(gaussian_config(dcda_window=1, anchors_per_class=3), stream)
    method = model.method
    # Every training feature was folded in: 20 per class (train_per_class), over the 4 classes.
    assert method.class_stats.counts.tolist() == [20.0] * 4
    drawn, labels = method.draw_anchors(model, torch.zeros(1))
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    # In 'memory_output' space each anchor is a draw of its own class's stored Gaussian: with many
    # draws, each label's anchors average to that class's mean of h~ and no other class's.
    method.config.anchors_per_class = 2000
    drawn, labels = method.draw_anchors(model, torch.zeros(1))
    means = method.class_stats.means().float()
    for c in range(4):
        centre = drawn[labels == c].mean(0)
        torch.testing.assert_close(centre, means[c], rtol=0, atol=0.1)
        assert int((means - centre).norm(dim=1).argmin()) == c
    # The draws depend on the step only (a resumed run draws what an unbroken one would): the same
    # step draws the same anchors, the next step others.
    torch.testing.assert_close(method.draw_anchors(model, torch.zeros(1))[0], drawn, rtol=0, atol=0)
    method.steps_seen += 1
    assert not torch.equal(method.draw_anchors(model, torch.zeros(1))[0], drawn)


def test_backbone_space_anchors_are_routed_through_the_memory():
    stream = feature_stream(2, train_per_class=20)
    model, _ = fit(gaussian_config(dcda_window=1, class_stats_space="backbone"), stream)
    method = model.method
    # Statistics of the frozen features: their means are those of the raw training data.
    raw = torch.tensor(np.stack(stream[0].train["features"]), dtype=torch.float32)
    labels = torch.tensor(stream[0].train["label"])
    torch.testing.assert_close(method.class_stats.means()[0].float(), raw[labels == 0].mean(0), rtol=0, atol=1e-5)
    drawn, _ = method.draw_anchors(model, torch.zeros(1))
    generator = torch.Generator().manual_seed(method.config.memory_init_seed * 1_000_003 + method.steps_seen)
    config = method.config
    h, _ = method.class_stats.sample(torch.arange(4), config.anchors_per_class, config.covariance_shrinkage, generator)
    with torch.no_grad():
        torch.testing.assert_close(drawn, method.memory(h).output, rtol=0, atol=0)


def test_stage2_trains_on_anchors_of_old_classes():
    stream = feature_stream(2, train_per_class=10)
    model, _ = _into_second_task(gaussian_config(dcda_window=1), stream, 2)
    losses = model(**FeatureCollator()([stream[1].train[i] for i in range(6)])).losses
    assert {"ce", "lwf", "align", "anchor"} <= set(losses)


# ---- the paper's anchors: router-weighted EMA statistics per slot -----------------------------------


def test_slot_statistics_ema_update_by_hand():
    m = 0.9
    stats = SlotStatistics(3, 2, momentum=m)
    x1, p1 = torch.tensor([[1.0, 2.0], [3.0, -1.0]]), torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    x2, p2 = torch.tensor([[0.0, 4.0]]), torch.tensor([[0.2, 0.8, 0.0]])
    stats.update(x1, p1)
    stats.update(x2, p2)
    # c <- m c + (1 - m) mean_b p_b;  mu <- m mu + (1 - m) mean_b p_b x_b, from zero.
    c1, mu1 = (1 - m) * torch.tensor([0.75, 0.25, 0.0]), (1 - m) * torch.tensor([[1.75, 0.0], [0.25, 0.5], [0, 0]])
    c2 = m * c1 + (1 - m) * torch.tensor([0.2, 0.8, 0.0])
    mu2 = m * mu1 + (1 - m) * torch.tensor([[0.0, 0.8], [0.0, 3.2], [0.0, 0.0]])
    torch.testing.assert_close(stats.mass, c2)
    torch.testing.assert_close(stats.sums, mu2)


def test_slot_anchor_formula_by_hand():
    """a_i = gamma_i * (mu_i / max(c_i, varsigma)) + beta_i, for active slots with statistics only."""
    stats = SlotStatistics(4, 2, momentum=0.99)
    stats.mass.copy_(torch.tensor([0.5, 0.0005, 0.2, 0.0]))  # slot 1 under the floor, slot 3 never used
    stats.sums.copy_(torch.tensor([[1.0, -2.0], [0.001, 0.002], [0.4, 0.6], [0.0, 0.0]]))
    gamma = torch.tensor([[2.0, 1.0], [1.0, 3.0], [0.5, 0.5], [1.0, 1.0]])
    beta = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.1, 0.2], [0.0, 0.0]])
    active = torch.tensor([True, True, False, True])  # slot 2 is inactive
    anchors = stats.anchors(gamma, beta, active, varsigma=1e-3)
    expected = torch.tensor([
        [2.0 * 1.0 / 0.5 + 0.0, 1.0 * -2.0 / 0.5 + 1.0],  # c_0 above the floor: its mean
        [1.0 * 0.001 / 1e-3 + 1.0, 3.0 * 0.002 / 1e-3 + 0.0],  # c_1 = 5e-4 < varsigma: divided by varsigma
    ])
    torch.testing.assert_close(anchors, expected)
    assert stats.anchor_slots(active).tolist() == [0, 1]


def test_method_folds_every_training_batch_into_the_slot_statistics():
    """Replaying the EMA over the batches with the routing the method saw gives its statistics."""
    stream = feature_stream(1, train_per_class=10)
    # The memory never moves: no stage 1, no growth, keys not re-seeded from data.
    model = get_cl_model(tiny_vit(), small_config(use_sgse=False, use_stage1=False, key_init="random"))
    model, _ = fit(None, stream, model=model)
    method, m = model.method, 1 - 1 / model.method.config.stat_horizon
    mass, sums = torch.zeros(16), torch.zeros(16, D)
    with torch.no_grad():
        for i in range(0, 20, 10):  # batch size 10, stream order
            features = torch.tensor(np.stack(stream[0].train["features"][i : i + 10]), dtype=torch.float32)
            routing = method.memory(features)
            mass = m * mass + (1 - m) * routing.probs.mean(0)
            sums = m * sums + (1 - m) * routing.probs.T @ routing.normed / 10
    torch.testing.assert_close(method.slot_stats.mass, mass)
    torch.testing.assert_close(method.slot_stats.sums, sums)


def test_slot_statistics_are_the_global_batch_under_ddp():
    """Two processes, each with half of the batch: after the step both hold the statistics one
    process holds after the whole batch (the method gathers what it folds in)."""
    stream = feature_stream(1, train_per_class=10)
    model = get_cl_model(tiny_vit(), small_config())
    model.grow_head(2)
    model.method.on_task_start(model, stream[0], _ctx())
    model.train()
    batch = FeatureCollator()([stream[0].train[i] for i in range(8)])
    with torch.no_grad():
        out = model(**batch)
    whole = {"labels": batch["labels"], **out.extras}
    from hf_clroute.core.method import StepContext

    single = copy.deepcopy(model.method)
    single.after_step(model, batch, out, _ctx())
    for rank in (0, 1):
        part = slice(4 * rank, 4 * rank + 4)
        halves = {k: v[part] for k, v in whole.items()}

        def gather(t, halves=halves):
            return next(whole[k] for k, h in halves.items() if h.shape == t.shape and torch.equal(h, t))

        method = copy.deepcopy(model.method)
        extras = {k: v[part] for k, v in out.extras.items()}
        local_out = dataclasses.replace(out, extras=extras, features=out.features[part])
        ctx = StepContext(task_id=0, process_index=rank, num_processes=2, _gather=gather, _reduce=lambda t: 2 * t)
        method.after_step(model, {"features": batch["features"][part], "labels": batch["labels"][part]}, local_out, ctx)
        torch.testing.assert_close(method.slot_stats.mass, single.slot_stats.mass, rtol=0, atol=0)
        torch.testing.assert_close(method.slot_stats.sums, single.slot_stats.sums, rtol=0, atol=0)
    assert single.slot_stats.mass.sum() > 0


def test_stage2_distils_the_previous_head_on_the_slot_anchors():
    stream = feature_stream(2, train_per_class=10)
    model, method = _into_second_task(small_config(dcda_window=1), stream, 2)
    losses = model(**FeatureCollator()([stream[1].train[i] for i in range(6)])).losses
    assert set(losses) == {"ce", "lwf", "anchor"}  # no alignment: slot anchors carry no label
    anchors = method.slot_anchors()
    assert len(anchors) == method.memory.num_slots  # every active slot has seen task 0
    # The teacher keeps every head row at the task's start; the default distils the old two.
    assert method.teacher_weight.shape[0] == 4 and method.old_classes == 2
    teacher = F.linear(anchors, method.teacher_weight[:2], method.teacher_bias[:2])
    expected = distillation(model.head(anchors)[:, :2], teacher, 3.0)
    torch.testing.assert_close(losses["anchor"], expected)
    # Over the old classes' logits only: the new classes' head rows get no gradient from it.
    model.head.zero_grad()
    losses["anchor"].backward()
    assert model.head.weight.grad[2:].abs().sum() == 0 and model.head.weight.grad[:2].abs().sum() > 0


# ---- distillation that bounds new-class logits -----------------------------------------------------------


def test_distillation_over_all_logits_is_old_logit_kd_plus_new_class_mass_penalty():
    torch.manual_seed(0)
    student, teacher, T = torch.randn(6, 5), torch.randn(6, 3), 3.0
    mass_new = F.softmax(student / T, dim=-1)[:, 3:].sum(-1)
    expected = distillation(student[:, :3], teacher, T) - torch.log1p(-mass_new).mean() * T**2
    torch.testing.assert_close(distillation(student, teacher, T), expected)
    # Equal widths: the Hinton KL, as torch computes it.
    log_p, q = F.log_softmax(student[:, :3] / T, -1), F.softmax(teacher / T, -1)
    reference = F.kl_div(log_p, q, reduction="batchmean") * T**2
    torch.testing.assert_close(distillation(student[:, :3], teacher, T), reference)


def test_new_class_logits_are_bounded_by_the_distillation_term():
    """Old-class-like inputs whose new-class logits start far above the old ones: the bounded
    term drives them below every old logit; old-logit-only distillation cannot touch them."""
    torch.manual_seed(0)
    teacher = torch.randn(16, 3) * 2
    start = torch.cat([teacher.clone(), torch.full((16, 2), 8.0)], dim=1)
    for bounded in (True, False):
        student = start.clone().requires_grad_(True)
        optimizer = torch.optim.SGD([student], lr=1.0)
        for _ in range(300):
            loss = distillation(student if bounded else student[:, :3], teacher, 3.0)
            optimizer.zero_grad()
            loss.backward()
            if bounded:
                assert (student.grad[:, 3:] > 0).all()  # every new logit is pushed down
            else:
                assert student.grad is None or (student.grad[:, 3:] == 0).all()
            optimizer.step()
        new, old = student.detach()[:, 3:], student.detach()[:, :3]
        if bounded:
            assert (new.max(1).values < old.max(1).values).all()
            mass = F.softmax(student.detach() / 3.0, -1)[:, 3:].sum(-1)
            assert mass.max() < 0.1 < F.softmax(start / 3.0, -1)[:, 3:].sum(-1).min()
        else:
            assert torch.equal(new, start[:, 3:])


def test_anchor_distillation_reaches_new_class_rows_only_when_bounded():
    stream = feature_stream(2, train_per_class=10)
    for bounded in (True, False):
        config = gaussian_config(dcda_window=1, bound_new_classes=bounded, lambda_align=0.0)
        model, method = _into_second_task(config, stream)
        routing = method.memory(torch.tensor(np.stack(stream[1].train["features"][:4]), dtype=torch.float32))
        model.head.zero_grad()
        anchor = method.stage2_losses(model, routing, model.head(routing.output))["anchor"]
        anchor.backward()
        assert (model.head.weight.grad[2:].abs().sum() > 0) == bounded


# ---- keys over the stream ---------------------------------------------------------------------------


def test_keys_are_seeded_from_every_task():
    n_domains = 3
    model, _ = fit(small_config(use_sgse=False, keys_per_task=2, dcda_window=100), feature_stream(n_domains))
    method = model.method
    history = method.extra_state()["slot_history"]
    starts = [step for step, _ in method.task_start_history]
    # Two slots switched on at each later task's first step.
    assert history == [[0, 4], [starts[1] + 1, 5], [starts[1] + 1, 6], [starts[2] + 1, 7], [starts[2] + 1, 8]]
    # Each slot's key points into the domain it was keyed in (domain k lives on axes 4k..4k+3).
    keys = method.memory.keys.detach()[: method.memory.num_slots]
    domain_of_key = [int(k.abs().reshape(-1)[: 4 * n_domains].reshape(n_domains, 4).sum(1).argmax()) for k in keys]
    assert domain_of_key == [0, 0, 0, 0, 1, 1, 2, 2]


# ---- the probe reads h~ -----------------------------------------------------------------------------


def test_features_are_the_memory_output():
    model = get_cl_model(tiny_vit(), small_config())
    model.grow_head(2)
    with torch.no_grad():
        model.method.memory.beta[:4] += 1.5  # an adapter that is not the identity
    h = torch.randn(5, D)
    model.eval()
    out = model(features=h)
    expected = model.method.memory(h).output
    torch.testing.assert_close(out.features, expected, rtol=0, atol=0)
    assert not torch.allclose(out.features, F.layer_norm(h, (D,)))


# ---- SGSE measured against task boundaries -------------------------------------------------------------


def test_expansion_timing_against_boundaries():
    timing = expansion_timing([5, 103, 110, 111, 250], boundary_steps=[100, 200], total_steps=300, window=10)
    assert (timing.expansions, timing.near_boundary, timing.away_from_boundary) == (5, 2, 3)  # 103, 110
    assert timing.near_boundary_fraction == pytest.approx(0.4)
    assert timing.expected_fraction == pytest.approx(20 / 300)
    assert timing.lift == pytest.approx(0.4 / (20 / 300))
    assert (timing.boundaries_detected, timing.boundaries) == (1, 2)
    assert expansion_timing([], [100], 300, 10).near_boundary_fraction is None


def test_sgse_rarely_expands_on_a_stationary_stream():
    rng = np.random.default_rng(0)
    test = ExpansionTest(D)
    confidences = stationary_confidences("router", 1000, rng)
    fired = [i for i, s in enumerate(confidences) if test.observe(float(s))]
    # ~50 tests at alpha = 0.05 each: about 2.5 false expansions expected, and fewer measured.
    assert len(fired) <= 3, fired


def test_sgse_on_top_similarity_fires_after_abrupt_shifts():
    """Orthogonal domains, one per task, no per-task keys: SGSE must find each new domain
    soon after its boundary, far more often than expansions at random steps would."""
    config = small_config(keys_per_task=0, max_slots=20, novelty_statistic="top_similarity")
    model, _ = fit(config, feature_stream(4, train_per_class=60))
    timing = model.method.sgse_timing(window=6)
    assert timing.boundaries == 3 and timing.boundaries_detected == 3, model.method.expansion_history
    assert timing.lift > 2.0 and timing.away_from_boundary <= 1
    assert model.method.extra_state()["sgse_timing"]["expansions"] == timing.expansions


def test_top_probability_misses_orthogonal_domains():
    """The paper's statistic, measured: keys seeded on one domain sit close together, so its
    inputs split their mass over several slots (s ~ 0.6), while an orthogonal domain, far from
    every key, is routed to whichever key is least far with s ~ 0.8. Confidence rises at the
    shift, and SGSE misses boundaries it is meant to detect."""
    model, _ = fit(small_config(keys_per_task=0, max_slots=20), feature_stream(4, train_per_class=60))
    assert model.method.sgse_timing(window=6).boundaries_detected < 3, model.method.expansion_history


@pytest.mark.parametrize("statistic", ["top_probability", "top_similarity"])
def test_sgse_on_the_method_stays_quiet_on_a_stationary_stream(statistic):
    """Four tasks drawn from one domain (new labels, same inputs): no shift to find."""
    rng = np.random.default_rng(3)
    stream = []
    for k in range(4):
        splits = {}
        for split, n in (("train", 60), ("test", 10)):
            feats = np.concatenate([domain_features(0, c, n, rng) for c in (0, 1)])
            splits[split] = Dataset.from_dict({"features": feats, "label": np.repeat([2 * k, 2 * k + 1], n).tolist()})
        stream.append(Experience(k, f"same{k}", [2 * k, 2 * k + 1], splits["train"].shuffle(seed=k), splits["test"]))
    model, _ = fit(small_config(keys_per_task=0, max_slots=20, novelty_statistic=statistic), stream)
    assert len(model.method.expansion_history) <= 2, model.method.expansion_history


def test_stage1_rehearses_the_memory_on_routed_anchors():
    """One input alone has no positive for the contrastive loss; with rehearse_memory the
    anchors of its class (and of every seen class) join the contrast, with gradient into the memory."""
    stream = feature_stream(2, train_per_class=10)
    with pytest.raises(ValueError, match="rehearse_memory"):
        gaussian_config(rehearse_memory=True)
    with pytest.raises(ValueError, match="anchors='class_gaussian'"):
        small_config(class_stats_space="backbone", rehearse_memory=True)  # slot anchors carry no label
    for rehearse in (False, True):
        config = gaussian_config(
            dcda_window=1, class_stats_space="backbone", rehearse_memory=rehearse, anchors_per_class=2
        )
        model, method = _into_second_task(config, stream, 1)
        supcon = model(**FeatureCollator()([stream[1].train[0]])).losses["supcon"]
        if rehearse:
            supcon.backward()
            assert supcon > 0 and method.memory.gamma.grad.abs().sum() > 0
        else:
            assert supcon == 0


# ---- settings files: the defaults and the named variants ---------------------------------------------


@pytest.mark.parametrize(
    "method", ["mars", "mars-head-only", "mars-task-keys", "mars-gaussian-align", "mars-gaussian-align-head-only",
               "mars-no-sgse", "mars-no-anchor"]
)
def test_settings_files_name_the_variants_and_search_with_the_same_budget(method, checked_search_grid):
    from hf_clroute.bench.harness.settings import resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig

    suite = SuiteConfig.load("split-mnist")
    config = resolve_run(suite, method, 0).adapter_config
    # Only the named variants depart from the paper's growth and anchors.
    assert config.keys_per_task == (4 if method == "mars-task-keys" else 0)
    assert config.anchors == ("class_gaussian" if method.startswith("mars-gaussian-align") else "slot")
    checked_search_grid(method)


@pytest.mark.parametrize("method", ["mars", "mars-gaussian-align"])
def test_each_mars_row_has_a_control_that_differs_only_in_the_memory(method):
    """mars's control has no memory at all (no router, slots or anchors: mars-memory-free); the Gaussian
    rehearsal row's control keeps its memory untrained. Everything else, training included, is the row's."""
    from hf_clroute.bench.harness.settings import method_file, method_search, resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig

    suite = SuiteConfig.load("split-mnist")
    control = method_file(method)["control"]
    ours, theirs = resolve_run(suite, method, 0), resolve_run(suite, control, 0)
    assert ours.training == theirs.training
    ours, theirs = ours.adapter_config, theirs.adapter_config
    differing = {f for f in vars(ours) if getattr(ours, f) != getattr(theirs, f)}
    if method == "mars":
        assert control == "mars-memory-free"
        assert differing == {"memory", "use_sgse", "use_anchors"}
        assert theirs.memory == "none" and not theirs.use_sgse and not theirs.use_anchors
        # the same two-knob budget: the LwF weight in place of the anchor weight it does not have
        swap = [{k.replace("lambda_lwf", "lambda_anchor"): v for k, v in p.items()}
                for p in method_search(control)["points"]]
        assert [p["config.stage2_ratio"] for p in swap] == [p["config.stage2_ratio"]
                                                             for p in method_search(method)["points"]]
        assert len(swap) == len(method_search(method)["points"])
    else:
        assert differing == {"use_stage1", "use_sgse"}  # the memory trains and grows, or it does not
        assert not theirs.use_stage1 and not theirs.use_sgse
        assert method_search(control) == method_search(method)
