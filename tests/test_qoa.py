"""QOA: weighted combination of support labels, the cosine-similarity scorer with its zero residual,
class-balanced supports, buffer items as training queries, buffer save/load, linear cost, engine run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.bench.harness.flops import count_flops
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import CLModel
from hf_clroute.core.outputs import CLModelOutput
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator
from hf_clroute.methods.qoa import (
    QoaConfig,
    QoaLearner,
    QueryOnlyAttention,
    SimilarityAttention,
)
from hf_clroute.methods.qoa.head import class_balanced_indices


def tiny_vit(seed: int = 0) -> ViTModel:
    torch.manual_seed(seed)
    return ViTModel(tiny_vit_config())


def support(n: int, dim: int = 6, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    return torch.randn(n, dim, generator=g), F.one_hot(labels, classes).float()


def test_prediction_is_a_convex_combination_of_support_labels():
    torch.manual_seed(0)
    qoa = QueryOnlyAttention(input_dim=6, label_dim=4, hidden_size=16, num_layers=2)
    query = torch.randn(5, 6)
    sx, sy = support(30)
    weights = qoa.weights(qoa.scores(query, sx, sy))
    assert (weights >= 0).all() and torch.allclose(weights.sum(-1), torch.ones(5))
    prediction = qoa(query, sx, sy)
    torch.testing.assert_close(prediction, weights @ sy)
    assert torch.allclose(prediction.sum(-1), torch.ones(5))  # one-hot labels -> a probability vector
    # A support set of one class can only predict that class, whatever the scores.
    same = F.one_hot(torch.full((30,), 2), 4).float()
    torch.testing.assert_close(qoa(query, sx, same), same[:5])
    # Regression: the prediction lies inside the range of the support targets.
    targets = torch.randn(30, 1)
    out = QueryOnlyAttention(6, 1, 16)(query, sx, targets)
    assert (out >= targets.min()).all() and (out <= targets.max()).all()


def test_scorer_is_an_mlp_over_query_item_and_label():
    torch.manual_seed(0)
    qoa = QueryOnlyAttention(input_dim=6, label_dim=4, hidden_size=16, num_layers=2)
    query = torch.randn(3, 6)
    sx, sy = support(7)
    # The same first layer as one Linear over the concatenation [x_t; x_j; y_j].
    w = torch.cat([qoa.query_proj.weight, qoa.item_proj.weight, qoa.label_proj.weight], dim=1)
    pairs = torch.cat([query[:, None].expand(3, 7, 6), sx[None].expand(3, 7, 6), sy[None].expand(3, 7, 4)], -1)
    expected = qoa.score(qoa.body(pairs @ w.T + qoa.query_proj.bias)).squeeze(-1)
    torch.testing.assert_close(qoa.scores(query, sx, sy), expected)


def test_mean_normalisation_reads_raw_scores():
    torch.manual_seed(0)
    qoa = QueryOnlyAttention(6, 4, 16, normalization="mean")
    query, (sx, sy) = torch.randn(2, 6), support(10)
    torch.testing.assert_close(qoa(query, sx, sy), qoa.scores(query, sx, sy) / 10 @ sy)
    assert not qoa.outputs_probabilities


@pytest.mark.parametrize(
    "kwargs, field",
    [({"support_size": 0}, "support_size"), ({"task": "ranking"}, "task"),
     ({"score_normalization": "sparsemax"}, "score_normalization"), ({"eval_support_size": -1}, "eval_support_size"),
     ({"freeze_backbone": False}, "freeze_backbone"), ({"scorer": "bilinear"}, "scorer"),
     ({"score_normalization": "mean"}, "score_normalization"), ({"temperature": 0.0}, "temperature"),
     ({"learn_temperature": "yes"}, "learn_temperature"), ({"learn_residual": 1}, "learn_residual"),
     ({"residual_reads_label": None}, "residual_reads_label"), ({"batch_queries": 0}, "batch_queries"),
     ({"support_per_class": -1}, "support_per_class"), ({"replay_queries": 2.5}, "replay_queries")],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        QoaConfig(**kwargs)


def fill(model: CLModel, labels: torch.Tensor, seed: int = 1) -> None:
    """Add ``labels`` with random features to the buffer, 10 at a time, as the engine does after each step."""
    g = torch.Generator().manual_seed(seed)
    for chunk in labels.split(10):
        out = CLModelOutput(features=torch.randn(len(chunk), 32, generator=g))
        model.method.after_step(model, {"labels": chunk}, out, StepContext(0))


def filled_model(n: int = 40, seed: int = 0, **config) -> CLModel:
    config = {"buffer_size": 32, "support_size": 8, "max_classes": 4, "seed": seed, **config}
    model = get_cl_model(tiny_vit(), QoaConfig(**config))
    model.method.num_classes = 4
    fill(model, torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(2)))
    return model


def test_untrained_head_is_a_cosine_similarity_attention_classifier():
    torch.manual_seed(0)
    query, (sx, sy) = torch.randn(5, 6) * 7, support(30)
    cosine = F.normalize(query, dim=1) @ F.normalize(sx, dim=1).T
    for learn in (True, False):
        head = SimilarityAttention(6, 4, hidden_size=16, num_layers=2, temperature=0.05, learn_temperature=learn)
        assert torch.count_nonzero(head.residual.score.weight) == 0  # the residual starts at exactly zero
        torch.testing.assert_close(head(query, sx, sy), (cosine / 0.05).softmax(-1) @ sy)
        assert isinstance(head.log_temperature, torch.nn.Parameter) == learn
        assert head.temperature == pytest.approx(0.05)
    # Training moves the residual off zero; the cosine still enters through its own input.
    head = SimilarityAttention(6, 4, hidden_size=16)
    torch.nn.init.normal_(head.residual.score.weight)
    assert not torch.allclose(head(query, sx, sy), (cosine / head.temperature).softmax(-1) @ sy)
    # The head's untrained evaluation logits: that classifier over the buffer, as log-probabilities.
    model = filled_model(n=60, support_per_class=32)
    model.eval()
    features = torch.randn(3, 32)
    items = model.method.buffer.contents()
    cosine = F.normalize(features, dim=1) @ F.normalize(items["features"], dim=1).T
    expected = (cosine / model.method.config.temperature).softmax(-1) @ F.one_hot(items["labels"], 4).float()
    floor = model.method.config.probability_floor
    torch.testing.assert_close(model(features=features).logits, torch.log((1 - floor) * expected + floor / 4))


def test_support_is_class_balanced_and_the_same_size_in_training_and_evaluation():
    # 30 of class 0, 12 of class 1, 5 of class 3, none of class 2: every class but the scarce one gets 8.
    labels = torch.tensor([0] * 30 + [1] * 12 + [3] * 5)[torch.randperm(47, generator=torch.Generator().manual_seed(0))]
    model = get_cl_model(tiny_vit(), QoaConfig(buffer_size=64, support_per_class=8, max_classes=4))
    model.method.num_classes = 4
    fill(model, labels)
    sizes = []
    for train in (True, False):
        model.train(train)
        support_x, support_y, slots = model.method.support()
        assert len(set(slots.tolist())) == len(slots)  # without replacement
        assert support_y.sum(0).tolist() == [8, 8, 0, 5]
        stored = model.method.buffer.contents()
        torch.testing.assert_close(support_x, stored["features"][slots])
        assert torch.equal(support_y.argmax(1), stored["labels"][slots])
        sizes.append(len(slots))
    assert sizes == [21, 21]
    # The helper alone: per-class caps, all of a class that has fewer.
    picked = class_balanced_indices(torch.tensor([2, 2, 2, 0, 2, 0]), 2, torch.Generator().manual_seed(0))
    assert sorted(torch.tensor([2, 2, 2, 0, 2, 0])[picked].tolist()) == [0, 0, 2, 2]


def test_buffer_items_are_training_queries_weighted_like_batch_queries():
    model = filled_model(n=40, replay_queries=6)
    method = model.method
    calls = []
    method.scorer.register_forward_hook(lambda mod, args, kwargs, out: calls.append((args, kwargs)), with_kwargs=True)
    model.train()
    batch = {"features": torch.randn(4, 32), "labels": torch.randint(0, 4, (4,))}
    out = model(**batch)
    assert set(out.losses) == {"ce", "replay"}
    (batch_args, batch_kwargs), (replay_args, _) = calls
    assert batch_args[0].shape == (4, 32) and batch_kwargs.get("mask") is None
    # The second query set is 6 stored items, the same ones as the replay draw of this step.
    slots = method.replay_slots()
    assert len(slots) == 6 and replay_args[0].shape == (6, 32)
    torch.testing.assert_close(replay_args[0], method.buffer.storage("features")[slots])
    # Every query weighs the same: each mean loss is scaled by its share of the 10 queries.
    full = F.cross_entropy(out.logits, batch["labels"])
    torch.testing.assert_close(out.losses["ce"], full * 4 / 10)
    log_probs = method.predict(method.buffer.storage("features")[slots], query_slots=slots)
    replay = F.nll_loss(log_probs, method.buffer.storage("labels")[slots])
    torch.testing.assert_close(out.losses["replay"], replay * 6 / 10)
    # Buffer queries only: the batch term carries no gradient; nothing is replayed at evaluation.
    only = filled_model(n=40, replay_queries=6, batch_queries=False)
    only.train()
    out = only(**batch)
    assert out.losses["ce"].item() == 0.0 and out.losses["replay"].item() > 0.0
    model.eval()
    assert method.replayed() == 0


@pytest.mark.parametrize("scorer, normalization", [("similarity", "softmax"), ("mlp", "softmax"), ("mlp", "mean")])
def test_a_replayed_query_is_not_in_its_own_support(scorer, normalization):
    model = filled_model(n=40, support_per_class=32, scorer=scorer, score_normalization=normalization)
    method = model.method
    model.train()
    slots = method.replay_slots()
    support_x, support_y, support_slots = method.support()
    assert set(slots.tolist()) <= set(support_slots.tolist())  # each query's own slot is in the draw...
    query = method.buffer.storage("features")[slots]
    masked = method.predict(query, query_slots=slots)
    for row, slot in enumerate(slots.tolist()):
        keep = support_slots != slot  # ...and predicting it is the same as leaving that slot out
        alone = method.scorer(query[row:row + 1], support_x[keep], support_y[keep])
        if normalization == "mean":  # mean over |S| items: the masked item adds 0 to the same sum
            alone = alone * keep.sum() / len(keep)
        floor = method.config.probability_floor
        expected = torch.log((1 - floor) * alone[:, :4] + floor / 4) if normalization == "softmax" \
            else F.log_softmax(alone[:, :4], dim=-1)
        torch.testing.assert_close(masked[row:row + 1], expected)
    # Without the mask, a stored item finds itself at cosine 1: it is its own nearest neighbour.
    head = method.scorer
    if scorer == "similarity":
        scores = head.scores(query, support_x, support_y)
        own = support_slots[scores.argmax(1)]
        assert torch.equal(own, slots)


def test_support_set_is_resampled_every_training_forward():
    model = filled_model(support_per_class=0)
    method = model.method
    seen = []
    method.scorer.register_forward_hook(lambda mod, args, out: seen.append(args[1].clone()))
    inputs = {"features": torch.randn(4, 32)}
    model.train()
    model(**inputs).logits
    model(**inputs).logits  # same buffer state: the same (reproducible) support
    fill(model, torch.randint(0, 4, (10,)), seed=3)
    model(**inputs).logits  # one step later: a new draw
    assert all(s.shape == (8, 32) for s in seen)
    torch.testing.assert_close(seen[0], seen[1])
    assert not torch.equal(seen[1], seen[2])
    # The standalone learner draws a new support at every training step too.
    learner = QoaLearner(QoaConfig(buffer_size=50, support_size=5, max_classes=4), input_dim=6)
    draws = []
    learner.predictor.register_forward_hook(lambda mod, args, out: draws.append(args[1].clone()))
    learner.observe(*support(50)[:1], torch.randint(0, 4, (50,)))
    for _ in range(3):
        learner.training_loss(torch.randn(2, 6), torch.randint(0, 4, (2,)))
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


def test_buffer_save_load_identity(tmp_path):
    model = filled_model(n=60)  # 60 items through a 32-slot reservoir
    model.eval()
    inputs = {"pixel_values": torch.randn(3, 3, 16, 16)}
    before = model(**inputs).logits
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path)
    loaded.eval()
    assert loaded.method.buffer.num_seen == 60 and loaded.method.num_classes == 4
    for name, tensor in model.method.buffer.contents().items():
        assert torch.equal(loaded.method.buffer.contents()[name], tensor)
    assert torch.equal(loaded(**inputs).logits, before)



def test_cost_is_linear_in_support_size():
    torch.manual_seed(0)
    qoa = QueryOnlyAttention(input_dim=6, label_dim=4, hidden_size=16, num_layers=3)
    query = torch.randn(5, 6)
    sizes = [16, 32, 64, 128, 256]
    flops = [count_flops(qoa, query, *support(s)) for s in sizes]
    per_item = (flops[1] - flops[0]) / (sizes[1] - sizes[0])
    assert per_item > 0
    # Exactly affine: f(S) = f(0) + per_item * S for every size (no |S|^2 term).
    assert all(f == flops[0] + per_item * (s - sizes[0]) for s, f in zip(sizes, flops))
    # Per support item: 5 queries x (16x16 hidden layers, the score) + the item/label projections.
    assert per_item == 5 * (2 * 2 * 16 * 16 + 2 * 16 + 2 * 4) + 2 * 16 * (6 + 4)


def test_qoa_head_through_the_engine_on_mnist():
    stream = class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3],
                               train_per_class=20, test_per_class=10, name="mnist")
    config = TrainingConfig(batch_size=8, learning_rate=1e-3, progress=False)
    model = get_cl_model(tiny_vit(), QoaConfig(buffer_size=64, support_size=16, hidden_size=16, max_classes=4))
    cfg = tiny_vit_config()
    trainer = ContinualTrainer(model, stream, config, ImageCollator(cfg.image_size, num_channels=cfg.num_channels),
                               make_accelerator(config, cpu=True))
    result = trainer.fit()
    R = result.accuracy_matrix
    assert len(R) == 2 and all(0.0 <= x <= 1.0 for row in R for x in row)
    assert R[0][1] == 0.0  # task 1's classes are unknown after task 0
    assert result.params["trainable_params"] == sum(p.numel() for p in model.method.scorer.parameters())
    buffer = model.method.buffer
    assert buffer.num_seen == 80 and len(buffer) == 64
    assert set(buffer.contents()["labels"].tolist()) == {0, 1, 2, 3}
    # The scorer was trained: its weights moved from their (seeded) initialisation.
    fresh = get_cl_model(tiny_vit(), QoaConfig(buffer_size=64, support_size=16, hidden_size=16, max_classes=4))
    assert not torch.equal(fresh.method.scorer.residual.score.weight, model.method.scorer.residual.score.weight)
    assert torch.count_nonzero(fresh.method.scorer.residual.score.weight) == 0


def test_plasticity_diagnostics_and_baselines():
    from hf_clroute.bench.runners.plasticity_learners import (
        ContinualBackprop,
        FullAttention,
        effective_rank,
    )

    # Effective rank: n equal eigenvalues -> n; one direction -> 1.
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0)
    v = torch.randn(5, 1)
    assert effective_rank(v @ v.T) == pytest.approx(1.0, abs=1e-3)
    # Full attention: a query sees the support and itself only, so other queries change nothing.
    torch.manual_seed(0)
    attention = FullAttention(6, 4, d_model=16, num_heads=2)
    sx, sy = support(12)
    q = torch.randn(3, 6)
    alone = attention(q[:1], sx, sy)
    torch.testing.assert_close(attention(q, sx, sy)[:1], alone)
    # Continual backprop re-initialises mature units: zero outgoing weights, reset age.
    cbp = ContinualBackprop(6, 4, False, 1e-3, hidden=8, layers=1, replacement_rate=0.5, maturity=2)
    x, y = torch.randn(10, 6), torch.randint(0, 4, (10,))
    for _ in range(4):
        cbp.train_step(x, y, 0)
    replaced = (cbp.age[0] == 0).nonzero().squeeze(1)  # replaced by the last step
    assert len(replaced) == 2  # 4 mature units x rate 0.5
    assert (cbp.linears[1].weight[:, replaced] == 0).all()


def test_memory_mlps_get_qoas_task_ids_and_memory():
    from hf_clroute.bench.runners.plasticity import (
        PlasticitySuite,
        Task,
        build_learner,
        parameter_count,
        run_stream,
    )

    suite = PlasticitySuite(name="t", kind="permuted-mnist", n_tasks=3, mlp={"hidden": 8, "layers": 1},
                            qoa={"buffer_size": 12, "support_size": 5, "hidden_size": 8, "num_layers": 1})
    g = torch.Generator().manual_seed(0)
    tasks = [Task(torch.rand(20, 6, generator=g), torch.randint(0, 10, (20,), generator=g),
                  torch.rand(8, 6, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(3)]
    qoa, memory = build_learner("qoa", suite, 6, seed=0), build_learner("backprop-memory", suite, 6, seed=0)
    replays = []
    original = memory.replayed
    def recorded():  # each draw, with the memory it was drawn from
        replays.append((original(), {k: b.contents()["x"].clone() for k, b in memory.memory.memory.items()}))
        return replays[-1][0]

    memory.replayed = recorded
    for t, task in enumerate(tasks):
        for x, y in zip(task.x_train.split(10), task.y_train.split(10)):
            qoa.train_step(x, y, t)
            memory.train_step(x, y, t)
    # The same memory: per-task reservoirs holding the same items as QOA's.
    assert set(memory.memory.memory) == set(qoa.learner.memory) == {"0", "1", "2"}
    for key, buffer in qoa.learner.memory.items():
        for name, tensor in buffer.contents().items():
            assert torch.equal(memory.memory.memory[key].contents()[name], tensor)
    # Replay from the second step on: 5 stored items with their own task's head.
    assert replays[0][0] is None and all(r is not None and len(r[0]) == 5 for r, _ in replays[1:])
    for (rx, ry, rhead), stored in replays[1:]:
        assert all((stored[str(int(rhead[0]))] == row).all(1).any() for row in rx)
    assert {int(r[2][0]) for r, _ in replays[1:]} == {0, 1, 2}  # every stored task gets replayed
    # The task id picks the head: one block of 10 logits per task.
    x = torch.rand(4, 6)
    full = memory.base.net(x).view(4, 3, 10)
    torch.testing.assert_close(memory.predict(x, 2), full[:, 2])
    # The Hessian is over one head: the size of a single-head MLP's last layer.
    problem = memory.hessian_problem(tasks[2].x_train[:6], tasks[2].y_train[:6], 2)
    single_head = build_learner("backprop", suite, 6, 0).hessian_problem(x, x, 0)
    assert parameter_count(*problem) == (8 + 1) * 10 == parameter_count(*single_head)
    full_head = memory.outputs(tasks[2].x_train[:6], torch.full((6,), 2))
    torch.testing.assert_close(problem[0](*problem[2]), full_head)
    assert full_head.shape == (6, 10)
    # Runs report the effective rank per parameter of the differentiated set too.
    suite.hessian_every, suite.hessian_examples, suite.window = 1, 6, 1
    row = run_stream("cbp-memory", suite, tasks, seed=0)
    assert row["hessian_parameters"] == 90
    assert row["erank_last_normalised"] == pytest.approx(row["erank_last"] / 90)


def test_plasticity_seeds_run_apart_merge_into_the_joint_table(tmp_path, capsys):
    import json

    from hf_clroute.cli import main

    suite = {
        "name": "drifting-regression", "kind": "drifting-regression", "runner": "plasticity",
        "n_tasks": 4, "train_per_task": 20, "test_per_task": 10, "old_eval_every": 2, "hessian_every": 2,
        "hessian_examples": 8, "window": 2, "mlp": {"hidden": 8, "layers": 1},
        "qoa": {"buffer_size": 30, "support_size": 8, "eval_support_size": 12, "hidden_size": 8, "num_layers": 1},
        "attention": {"d_model": 8, "num_layers": 1, "num_heads": 2}, "methods": ["qoa", "backprop", "backprop-memory"],
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))

    def bench(seeds: str, out: str) -> dict:
        assert main(["bench", "--suite", str(path), "--seeds", seeds, "--out", str(tmp_path / out)]) == 0
        return json.loads((tmp_path / out / "results.json").read_text())

    joint = bench("0,1", "joint")
    bench("0", "s0"), bench("1", "s1")
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["seeds"] == [0, 1] and len(merged["commands"]) == 3
    drop_timing = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    for method in ("qoa", "backprop", "backprop-memory"):
        assert drop_timing(merged["methods"][method]["per_seed"]) == drop_timing(joint["methods"][method]["per_seed"])
        assert merged["methods"][method]["last_window"] == joint["methods"][method]["last_window"]
    assert (tmp_path / "merged" / "plasticity.png").is_file()
    # Runs of a different suite config are refused, naming the problem.
    suite["n_tasks"] = 3
    path.write_text(json.dumps(suite))
    bench("2", "other")
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "other"), "--out", str(tmp_path / "bad")]) == 2
    assert "different suites or suite configs" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_cost_table_counts_full_attention_as_quadratic_and_qoa_as_linear():
    from hf_clroute.bench.runners.plasticity import PlasticitySuite, cost_versus_support

    suite = PlasticitySuite(name="t", kind="permuted-mnist", qoa={"hidden_size": 16, "num_layers": 1},
                            attention={"d_model": 16, "num_layers": 1, "num_heads": 2})
    cost = cost_versus_support(input_dim=6, label_dim=4, suite=suite, sizes=(20, 40, 80, 160))
    sizes = np.array([20, 40, 80, 160], dtype=float)
    for name, quadratic in (("qoa", 0.0), ("full_attention", 4 * 16)):
        flops = np.array(cost[name]["flops"], dtype=float)
        fit = np.polyfit(sizes, flops, 2)
        assert np.allclose(np.polyval(fit, sizes), flops)  # at most quadratic
        # QK^T and AV over the (|S| + 10)^2 score matrix: 2 matmuls x 2 flops x d_model per entry.
        assert fit[0] == pytest.approx(quadratic, abs=1e-6 * flops.max())
    assert cost["qoa"]["linear_fit_r2"] == pytest.approx(1.0) and cost["full_attention"]["linear_fit_r2"] < 0.9999
    # the switch to countable attention is undone afterwards
    assert torch.backends.mha.get_fastpath_enabled()
