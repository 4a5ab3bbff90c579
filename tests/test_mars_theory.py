"""MaRS as its theory requires (issue 32): the options the mars row uses, each tested on its own.

1. full-output anchor consistency (``full_output_consistency``): Theorem 2 bounds the old classes'
   accuracy drop only if the anchors' whole prediction stays consistent;
2. anchors that keep representing old data (``anchor_memory``: banked at task start or expansion);
3. SGSE against a calibrated reference (``reference_window``): its false-expansion rate on a stationary
   stream is at most alpha, and it fires within 2n trials of a shift;
4. a stage schedule that gives the classifier its steps (``stage2_ratio``).

Synthetic feature streams as in test_mars.py; every stream is seeded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_mars import D, _into_second_task, feature_stream, fit, small_config, tiny_vit

from hf_clroute import CLModel, get_cl_model
from hf_clroute.bench.harness.feature_cache import FeatureCollator
from hf_clroute.methods.mars import ExpansionTest, SlotMemory
from hf_clroute.methods.mars.method import distillation
from hf_clroute.methods.mars.sgse import reference_success_cdf

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


def theory_config(**overrides):
    return small_config(**{"dcda_window": 1, "full_output_consistency": "anchors",
                           "anchor_memory": "task_start", **overrides})


def batch_of(experience, n=6):
    return FeatureCollator()([experience.train[i] for i in range(n)])


# ---- 1. full-output anchor consistency ----------------------------------------------------------------


def anchor_loss(model, method, experience) -> torch.Tensor:
    routing = method.memory(batch_of(experience)["features"])
    return method.stage2_losses(model, routing, model.head(routing.output))["anchor"]


@pytest.mark.parametrize("consistency", ["anchors", "none"])
def test_full_output_anchor_loss_is_zero_until_new_logits_rise_on_old_inputs(consistency):
    """Right after the task starts the head is its own teacher: zero. Raising the new classes'
    logits on the anchors (old-task inputs) is a violation only the full-output form sees."""
    stream = feature_stream(2, train_per_class=10)
    model, method = _into_second_task(theory_config(full_output_consistency=consistency), stream, 2)
    assert method.teacher_classes == 4 and method.old_classes == 2
    assert anchor_loss(model, method, stream[1]).item() == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        model.head.bias[2:] += 3.0  # every old input now leans towards the new classes
    loss = anchor_loss(model, method, stream[1])
    if consistency == "none":  # the old-logit form is blind to it
        assert loss.item() == pytest.approx(0.0, abs=1e-6)
        return
    assert loss.item() > 0.1
    model.head.zero_grad()
    loss.backward()
    assert (model.head.bias.grad[2:] > 0).all()  # descent pushes the new logits back down
    # It is the KL from the task-start head over every output, on the anchors.
    anchors = method.slot_anchors()
    teacher = F.linear(anchors, method.teacher_weight, method.teacher_bias)
    torch.testing.assert_close(loss, method.config.lambda_anchor * distillation(model.head(anchors), teacher, 3.0))


def test_lwf_over_every_output_only_when_asked():
    stream = feature_stream(2, train_per_class=10)
    for consistency, rows_reached in (("anchors", False), ("anchors_and_lwf", True)):
        model, method = _into_second_task(theory_config(full_output_consistency=consistency, use_anchors=False),
                                          stream, 2)
        routing = method.memory(batch_of(stream[1])["features"])
        lwf = method.stage2_losses(model, routing, model.head(routing.output))["lwf"]
        assert lwf.item() == pytest.approx(0.0, abs=1e-6)  # the head has not moved
        with torch.no_grad():
            model.head.bias[2:] += 3.0
        lwf = method.stage2_losses(model, routing, model.head(routing.output))["lwf"]
        model.head.zero_grad()
        lwf.backward()
        assert (model.head.bias.grad[2:].abs().sum() > 0) == rows_reached


# ---- 2. anchors that keep representing old data -----------------------------------------------------------


def domain_share(vectors: torch.Tensor, domain: int) -> torch.Tensor:
    """How much of each vector lies on domain ``domain``'s axes (test_mars: domain k on 4k..4k+3)."""
    v = vectors.abs()
    return v[:, 4 * domain : 4 * domain + 4].sum(1) / v.sum(1)


def test_task_start_snapshot_is_taken_and_used():
    stream = feature_stream(2, train_per_class=20)
    model, _ = fit(theory_config(), stream[:1])
    method = model.method
    stats = method.slot_stats
    used = torch.nonzero(method.memory.active_mask() & (stats.mass >= method.config.varsigma)).flatten()
    expected = stats.means(method.config.varsigma)[used].clone()
    assert len(method.anchor_bank) == 0  # nothing banked during the first task
    model.grow_head(4)
    method.begin_task(model, stream[1], torch_ctx())
    # Taken: one entry per used slot, the slot means as they were; the live statistics restart.
    assert method.anchor_bank.slots.tolist() == used.tolist() and len(used) > 0
    torch.testing.assert_close(method.anchor_bank.means, expected)
    assert stats.mass.abs().sum() == 0
    # Used: stage 2's anchors are the banked means through the slots' current adapters.
    with torch.no_grad():
        method.memory.beta[used] += 0.5
    anchors = method.slot_anchors()
    torch.testing.assert_close(anchors, method.memory.gamma[used] * expected + method.memory.beta[used])


def test_banked_anchors_stay_on_the_old_task_while_live_ones_drift():
    """After training on domain 1, live EMA anchors describe domain 1; banked ones still describe domain 0."""
    stream = feature_stream(2, train_per_class=40)
    shares = {}
    for memory in ("task_start", "ema"):
        model, _ = fit(theory_config(anchor_memory=memory, stat_horizon=3, use_sgse=False), stream)
        anchors = model.method.slot_anchors()
        shares[memory] = (domain_share(anchors, 0).mean().item(), domain_share(anchors, 1).mean().item())
    assert shares["task_start"][0] > 0.3 > shares["task_start"][1], shares
    assert shares["ema"][1] > 0.3 > shares["ema"][0], shares


def test_expansion_snapshot_banks_at_each_sgse_expansion():
    config = theory_config(anchor_memory="expansion", novelty_statistic="top_similarity", max_slots=20)
    model, _ = fit(config, feature_stream(3, train_per_class=60))
    method = model.method
    expansions = len(method.expansion_history)
    assert expansions >= 2
    # Every expansion banked the used slots (at least one each); no snapshot at task starts.
    assert len(method.anchor_bank) >= expansions
    assert method.extra_state()["banked_anchors"] == len(method.anchor_bank)


def test_banked_anchors_survive_save_and_load(tmp_path):
    stream = feature_stream(3, train_per_class=10)
    model, _ = fit(theory_config(), stream)
    assert len(model.method.anchor_bank) > 0
    model.save_pretrained(tmp_path / "adapter")
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path / "adapter")
    torch.testing.assert_close(loaded.method.anchor_bank.entries, model.method.anchor_bank.entries, rtol=0, atol=0)
    torch.testing.assert_close(loaded.method.teacher_weight, model.method.teacher_weight, rtol=0, atol=0)


def torch_ctx():
    from hf_clroute.core.method import StepContext

    return StepContext(task_id=1)


# ---- 3. SGSE against a calibrated reference -----------------------------------------------------------------


def test_reference_law_matches_simulation():
    """Failures of n fresh draws below the k-th smallest of R reference draws (any continuous law):
    the Beta-binomial the threshold is computed from, checked by simulation."""
    n, R, eps = 20, 200, 0.1
    test = ExpansionTest(2, eps=eps, trials=n, reference=R)
    cdf = reference_success_cdf(n, R, test.rank)
    rng = np.random.default_rng(0)
    draws = rng.exponential(size=(20000, R + n))
    level = np.sort(draws[:, :R], axis=1)[:, test.rank]
    successes = (draws[:, R:] >= level[:, None]).sum(1)
    for x in (12, 14, 15, 16, 17):
        assert abs((successes <= x).mean() - cdf(x)) < 0.006, x
    # An independent-trials (binomial) threshold would be looser than the exact one.
    assert test.false_expansion_bound <= 0.05
    assert cdf(15) > 0.05 >= test.false_expansion_bound


def keyed_memory(rng, centres) -> SlotMemory:
    memory = SlotMemory(D, num_slots=12, max_slots=16)
    with torch.no_grad():
        for i in range(12):
            memory.set_key(i, memory.query(torch.tensor(centres[i % len(centres)] + rng.normal(0, 1.0, D),
                                                         dtype=torch.float32)))
    return memory


def statistic(memory: SlotMemory, x: np.ndarray, kind: str) -> np.ndarray:
    with torch.no_grad():
        routing = memory(torch.tensor(x, dtype=torch.float32))
    return (routing.similarity if kind == "top_similarity" else routing.energy).numpy()


def gaussian_mixture(centres, n, rng) -> np.ndarray:
    return centres[rng.integers(0, len(centres), n)] + rng.normal(0, 1.0, (n, D))


ALPHA, TRIALS, REFERENCE = 0.05, 20, 200
DELAY = 2 * TRIALS  # stated detection delay: the block the shift falls in, plus the next one


@pytest.mark.parametrize("kind", ["top_similarity", "energy"])
def test_calibrated_sgse_false_expansion_rate_is_at_most_alpha(kind):
    """A stationary Gaussian-mixture stream through a data-keyed router: at most alpha per test."""
    rng = np.random.default_rng(1)
    centres = rng.normal(0.0, 3.0, (3, D))
    memory = keyed_memory(rng, centres)
    test = ExpansionTest(D, alpha=ALPHA, trials=TRIALS, reference=REFERENCE)
    for s in statistic(memory, gaussian_mixture(centres, 1500 * TRIALS + REFERENCE, rng), kind):
        test.observe(float(s))
    assert test.tests >= 1200  # (each expansion spends R inputs re-filling the reference)
    assert test.expansions / test.tests <= ALPHA, f"{test.expansions} false expansions in {test.tests} tests"


@pytest.mark.parametrize("kind", ["top_similarity", "energy"])
def test_calibrated_sgse_fires_within_two_blocks_of_a_shift(kind):
    """A new cluster no key covers, after a stationary stretch: an expansion within 2n inputs of
    every seeded shift that finds the reference full (a false expansion in the R inputs before it
    restarts the reference), keyed towards the new cluster."""
    delays = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        centres = rng.normal(0.0, 3.0, (4, D))
        memory = keyed_memory(rng, centres[:3])
        before = gaussian_mixture(centres[:3], int(rng.integers(400, 420)), rng)
        after = gaussian_mixture(centres[3:], DELAY, rng)
        queries = memory.query(torch.tensor(np.concatenate([before, after]), dtype=torch.float32)).detach()
        values = statistic(memory, np.concatenate([before, after]), kind)
        test = ExpansionTest(D, alpha=ALPHA, trials=TRIALS, reference=REFERENCE)
        fired = [i for i, (s, q) in enumerate(zip(values, queries)) if test.observe(float(s), q)]
        if any(len(before) - REFERENCE <= i < len(before) for i in fired):
            continue
        hit = [i - len(before) + 1 for i in fired if i >= len(before)]
        assert hit, f"seed {seed}: no expansion within {DELAY} inputs of the shift"
        delays.append(hit[0])
        new_key = F.normalize(queries[len(before):].mean(0), dim=0)
        assert float(test.new_key @ new_key) > 0.9
    assert len(delays) >= 6 and max(delays) <= DELAY, delays


def test_calibrated_sgse_on_the_method_finds_every_boundary():
    config = theory_config(novelty_statistic="top_similarity", reference_window=100, max_slots=20)
    model, _ = fit(config, feature_stream(4, train_per_class=60))
    timing = model.method.sgse_timing(window=10)
    assert timing.boundaries == 3 and timing.boundaries_detected == 3, model.method.expansion_history
    assert timing.away_from_boundary <= 1


# ---- 4. a stage schedule that gives the classifier its steps --------------------------------------------


@pytest.mark.parametrize("ratio,window,expected", [(1, 1, [1, 2, 1, 2, 1, 2, 1, 2]),
                                                   (3, 1, [1, 2, 2, 2, 1, 2, 2, 2]),
                                                   (2, 2, [1, 1, 2, 2, 2, 2, 1, 1])])
def test_stage2_ratio_gives_the_head_its_share_of_steps(ratio, window, expected):
    model = get_cl_model(tiny_vit(), small_config(dcda_window=window, stage2_ratio=ratio))
    method = model.method
    stages = []
    for step in range(8):
        method.task_step = step
        stages.append(method.stage())
    assert stages == expected


def test_stage2_ratio_trains_the_head_on_its_steps():
    """Through the engine: the head moves on stage-2 steps only, 3 in every 4."""
    stream = feature_stream(1, train_per_class=40)
    model = get_cl_model(tiny_vit(), small_config(dcda_window=1, stage2_ratio=3))
    seen = []
    original = model.method.after_step

    def record(*args):
        seen.append((model.method.stage(), "ce" in args[2].losses))
        original(*args)

    model.method.after_step = record
    fit(None, stream, model=model)
    assert [s for s, _ in seen] == [1, 2, 2, 2] * 2
    assert all(has_ce == (stage == 2) for stage, has_ce in seen)


@pytest.mark.parametrize("field,value", [("full_output_consistency", "all"), ("anchor_memory", "bank"),
                                         ("reference_window", -1), ("reference_window", 5), ("stage2_ratio", 0)])
def test_new_options_reject_bad_values_naming_the_field(field, value):
    from hf_clroute.methods.mars import MarsConfig

    with pytest.raises(ValueError, match=field):
        MarsConfig(**{"num_slots": 4, "max_slots": 8, field: value})


# ---- the settings files: the mars row, its ablations, and the first reading ------------------------------


def test_mars_row_sets_the_options_and_mars_paper_keeps_the_first_reading():
    from hf_clroute.bench.harness.settings import resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig

    suite = SuiteConfig.load("split-mnist")
    options = ("full_output_consistency", "anchor_memory", "reference_window", "novelty_statistic", "stage2_ratio")

    def values(row):
        config = resolve_run(suite, row, 0).adapter_config
        return config, tuple(getattr(config, f) for f in options)

    mars, chosen = values("mars")
    assert chosen[:4] == ("anchors", "task_start", 0, "top_probability")  # SGSE: the tracked level won on validation
    # The rows measured before these options (and their controls) keep the first reading.
    for row in ("mars-paper", "mars-paper-head-only", "mars-gaussian-align", "mars-gaussian-align-head-only",
                "mars-fsa-slda", "mars-task-keys", "mars-seq"):
        assert values(row)[1] == ("none", "ema", 0, "top_probability", 1), row
    # Each ablation differs from the mars row in its own switch only.
    for row, switch in (("mars-no-sgse", {"use_sgse"}), ("mars-no-anchor", {"use_anchors"}),
                        ("mars-no-stage1", {"use_stage1"}), ("mars-no-stage2", {"use_stage2"}),
                        ("mars-head-only", {"use_stage1", "use_sgse"})):
        config = values(row)[0]
        assert {f for f in vars(mars) if getattr(mars, f) != getattr(config, f)} == switch, row
