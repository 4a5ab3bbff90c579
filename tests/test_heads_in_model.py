"""Statistics heads inside CLModel, trained by the real engine, and the baselines built from them
(simplecil / ncm, slda, ranpac, knn), the head setting and its validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import ViTModel

from hf_clroute import CLConfig, ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import (
    FinetuneConfig,
    KNNConfig,
    NCMConfig,
    RanPACConfig,
    SimpleCILConfig,
    SLDAConfig,
)
from hf_clroute.core.method import StepContext, cross_entropy_over_scored
from hf_clroute.core.model import CLModel
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator
from hf_clroute.heads import IncrementalClassifier, StatisticsHead, build_head
from hf_clroute.methods.qoa import QoaConfig

D = tiny_vit_config().hidden_size
TOL = {"rtol": 1e-9, "atol": 1e-9}  # float64 sums in another order / batching
STATISTICS_METHODS = {
    "simplecil": lambda **kw: SimpleCILConfig(**kw),
    "ncm-euclidean": lambda **kw: NCMConfig(metric="euclidean", **kw),
    "slda": lambda **kw: SLDAConfig(**kw),
    "ranpac": lambda **kw: RanPACConfig(
        head_options={"projection_dim": 96, "ridge_lambda": 0.5, "nonlinearity": "relu"}, **kw
    ),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


@pytest.fixture(scope="module")
def stream():
    return class_incremental(
        load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=10, test_per_class=4,
        name="mnist",
    )


def tiny_vit() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config())


def collator() -> ImageCollator:
    cfg = tiny_vit_config()
    return ImageCollator(cfg.image_size, num_channels=cfg.num_channels)


def fit(config, stream, batch_size: int = 8):
    training = TrainingConfig(batch_size=batch_size, learning_rate=1e-3, progress=False)
    model = get_cl_model(tiny_vit(), config)
    ContinualTrainer(model, stream, training, collator(), make_accelerator(training, cpu=True)).fit()
    return model


@pytest.fixture(scope="module")
def fitted(stream):
    cache: dict[str, CLModel] = {}

    def get(name: str) -> CLModel:
        if name not in cache:
            cache[name] = fit(STATISTICS_METHODS[name](), stream)
        return cache[name]

    return get


def features_of(model: CLModel, rows) -> torch.Tensor:
    batch = collator()(list(rows))
    with torch.no_grad():
        return model.extract_features({"pixel_values": batch["pixel_values"]})


def all_train(stream):
    features_rows = [row for e in stream for row in e.train]
    return features_rows, torch.tensor([row["label"] for row in features_rows])


def all_test(stream):
    return [row for e in stream for row in e.test]


# ---- trained by the engine == batch-fitted on all training features ---------------------------
@pytest.mark.parametrize("name", sorted(STATISTICS_METHODS))
def test_engine_trained_head_equals_batch_fit(name, stream, fitted):
    model = fitted(name)
    assert isinstance(model.head, StatisticsHead) and model.trainable_parameters() == []
    rows, labels = all_train(stream)
    reference = build_head(model.config.head, D, **model.config.head_build_options())
    reference.grow(4)
    reference.accumulate(features_of(model, rows), labels)
    reference.sync()
    assert torch.equal(model.head.counts, torch.full((4,), 10.0, dtype=torch.float64))
    test_x = features_of(model, all_test(stream)).double()
    torch.testing.assert_close(model.head(test_x), reference(test_x), **TOL)
    model.eval()
    with torch.no_grad():
        logits = model(pixel_values=collator()(all_test(stream))["pixel_values"]).logits
    assert torch.equal(logits.argmax(1), reference(test_x).argmax(1))


@pytest.mark.parametrize("name", sorted(STATISTICS_METHODS))
def test_save_load_is_bit_identical(name, stream, fitted, tmp_path):
    model = fitted(name)
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path)
    assert loaded.extra_state() == model.extra_state() and "head" in model.extra_state()
    saved, restored = model.adapter_state_dict(), loaded.adapter_state_dict()
    assert saved.keys() == restored.keys() and all(k.startswith("head.") for k in saved)
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
    pixels = collator()(all_test(stream))["pixel_values"]
    model.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(pixel_values=pixels).logits, model(pixel_values=pixels).logits)


def test_resume_mid_task_equals_uninterrupted(stream, fitted, tmp_path):
    full = fitted("slda")
    ckpt = tmp_path / "ckpt"
    options = {"batch_size": 8, "learning_rate": 1e-3, "progress": False, "checkpoint_dir": str(ckpt),
               "checkpoint_every": 3}
    for stop in (7, 0):  # killed at step 7 (checkpoint at step 6, mid task 1), then resumed to the end
        training = TrainingConfig(**options, stop_after_steps=stop)
        model = get_cl_model(tiny_vit(), SLDAConfig())
        trainer = ContinualTrainer(model, stream, training, collator(), make_accelerator(training, cpu=True))
        result = trainer.fit(resume_from=ckpt if not stop else None)
    assert result.finished
    for name, tensor in full.adapter_state_dict().items():
        torch.testing.assert_close(model.adapter_state_dict()[name], tensor, **TOL)


@pytest.mark.parametrize("name", ["simplecil", "slda", "ranpac"])
def test_shuffled_stream_order_gives_the_same_predictions(name, stream, fitted):
    # Shuffled within each task, the tasks in reverse order, another batch size: the same sums.
    shuffled = [dataclasses.replace(e, train=e.train.shuffle(seed=7).flatten_indices()) for e in reversed(stream)]
    assert [r["label"] for r in shuffled[-1].train] != [r["label"] for r in stream[0].train]
    other = fit(STATISTICS_METHODS[name](), shuffled, batch_size=5)
    model = fitted(name)
    test_x = features_of(model, all_test(stream)).double()
    torch.testing.assert_close(other.head(test_x), model.head(test_x), **TOL)
    assert torch.equal(other.head(test_x).argmax(1), model.head(test_x).argmax(1))


def test_a_statistics_head_on_another_method_and_the_linear_default(stream):
    # Any method takes a head: finetune on a frozen backbone with an LDA head is slda.
    slda_like = fit(FinetuneConfig(freeze_backbone=True, head="lda"), stream)
    slda = fit(SLDAConfig(), stream)
    assert torch.equal(slda_like.head.weight, slda.head.weight)
    # The linear head is today's IncrementalClassifier, grown from head_init_seed.
    model = get_cl_model(tiny_vit(), FinetuneConfig(head_init_seed=5))
    model.grow_head(3)
    model.grow_head(5)
    twin = IncrementalClassifier(D)
    twin.grow(3, generator=torch.Generator().manual_seed(5 * 1_000_003))
    twin.grow(5, generator=torch.Generator().manual_seed(5 * 1_000_003 + 3))
    assert type(model.head) is IncrementalClassifier and torch.equal(model.head.weight, twin.weight)


def test_ranpac_projection_follows_head_init_seed():
    heads = [get_cl_model(tiny_vit(), RanPACConfig(head_init_seed=s)).head for s in (0, 0, 3)]
    assert heads[2].seed == 3 and heads[0].settings()["seed"] == 0
    assert torch.equal(heads[0].projection, heads[1].projection)
    assert not torch.equal(heads[0].projection, heads[2].projection)
    assert "seed" not in RanPACConfig().head_options


def test_loss_with_unseen_classes_is_finite():
    # A trained backbone under a statistics head: a class with no statistics yet scores -inf.
    model = get_cl_model(tiny_vit(), FinetuneConfig(freeze_backbone=False, head="prototype"))
    model.grow_head(3)
    pixels = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(pixel_values=pixels)
    ctx = StepContext(task_id=0)
    model.after_step({"labels": torch.tensor([0, 0, 1, 1])}, out, ctx)
    model.before_evaluation(ctx)
    model.train()
    out = model(pixel_values=pixels, labels=torch.tensor([0, 2, 1, 2]))  # class 2 unseen
    assert torch.isinf(out.logits[:, 2]).all() and torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.trainable_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    # Only unseen targets: a zero loss with a zero (not NaN) gradient.
    logits = torch.tensor([[0.5, float("-inf")], [1.0, float("-inf")]], requires_grad=True)
    loss = cross_entropy_over_scored(logits, torch.tensor([1, 1]))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros(2, 2))
    # And where every target is scored, it is the plain mean cross-entropy.
    plain = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 1, 2, 1, 0])
    torch.testing.assert_close(cross_entropy_over_scored(plain, targets), F.cross_entropy(plain, targets))


# ---- head validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: FinetuneConfig(head="mlp"), r"FinetuneConfig\.head must be one of .*'linear'.*'ranpac'"),
        (lambda: FinetuneConfig(head="lda", head_options={"shrinkage": 2.0}), r"head_options.*shrinkage"),
        (lambda: FinetuneConfig(head="prototype", head_options={"metric": "manhattan"}), r"head_options.*metric"),
        (lambda: FinetuneConfig(head="prototype", head_options={"shrinkage": 0.1}),
         r"head_options.*unknown option.*shrinkage"),
        (lambda: FinetuneConfig(head="ranpac", head_options={"projection_dim": 0}), r"head_options.*projection_dim"),
        (lambda: FinetuneConfig(head="ranpac", head_options={"seed": 1}), r"head_options.*'seed'.*head_init_seed"),
        (lambda: FinetuneConfig(head="lda", head_options={"num_classes": 3}), r"head_options.*'num_classes'"),
        (lambda: FinetuneConfig(head_options=["metric"]), r"head_options must be a dict"),
        (lambda: SimpleCILConfig(head="lda"), r"SimpleCILConfig\.head must be 'prototype'"),
        (lambda: SLDAConfig(freeze_backbone=False), r"SLDAConfig\.freeze_backbone"),
        (lambda: RanPACConfig(head_options={"ridge_lambda": 0}), r"RanPACConfig\.head_options.*ridge_lambda"),
        (lambda: NCMConfig(metric="euclidean", head_options={"metric": "cosine"}), r"NCMConfig\.metric"),
        (lambda: KNNConfig(k=0), r"KNNConfig\.k"),
        (lambda: KNNConfig(buffer_size=0), r"KNNConfig\.buffer_size"),
        (lambda: KNNConfig(freeze_backbone=False), r"KNNConfig\.freeze_backbone"),
    ],
)
def test_head_validation_names_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_method_with_its_own_classifier_refuses_a_statistics_head():
    with pytest.raises(ValueError, match="cannot use head 'lda'"):
        get_cl_model(tiny_vit(), QoaConfig(head="lda"))


def test_head_settings_round_trip_through_json(tmp_path):
    for config in [FinetuneConfig(head="lda", head_options={"shrinkage": 0.5}), NCMConfig(metric="euclidean"),
                   *(make() for make in STATISTICS_METHODS.values()), KNNConfig(k=3)]:
        config.save_pretrained(tmp_path)
        assert CLConfig.from_pretrained(tmp_path) == config
    assert NCMConfig().head == "prototype" and NCMConfig().head_options == {"metric": "cosine"}
    assert CLConfig.from_dict({"method": "finetune"}).head == "linear"  # configs saved before the field


# ---- simplecil == the old ncm ------------------------------------------------------------------
def old_ncm_logits(sums: torch.Tensor, counts: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The removed ncm baseline's classify (cosine), from its float64 class sums and counts."""
    means = (sums / counts.clamp_min(1).unsqueeze(1)).to(features.dtype)
    scores = F.normalize(features, dim=-1) @ F.normalize(means, dim=-1).T
    return scores.masked_fill(counts.unsqueeze(0) == 0, float("-inf"))


@pytest.mark.parametrize("make", [SimpleCILConfig, NCMConfig])
def test_simplecil_equals_the_old_ncm_on_a_toy_set(make):
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(5, D, generator=g)
    labels = torch.arange(5).repeat(8)[torch.randperm(40, generator=g)]
    train = centers[labels] + 0.8 * torch.randn(40, D, generator=g)
    test = centers[torch.arange(5).repeat(6)] + 0.8 * torch.randn(30, D, generator=g)
    model = get_cl_model(tiny_vit(), make())
    model.grow_head(6)  # class 5 never seen
    ctx = StepContext(task_id=0)
    for chunk in torch.arange(40).split(7):
        with torch.no_grad():
            out = model(features=train[chunk])
        model.after_step({"features": train[chunk], "labels": labels[chunk]}, out, ctx)
    model.before_evaluation(ctx)
    sums = torch.zeros(6, D, dtype=torch.float64).index_add_(0, labels, train.double())
    counts = torch.bincount(labels, minlength=6).double()
    expected = old_ncm_logits(sums, counts, test)
    with torch.no_grad():
        ours = model(features=test).logits
    assert torch.equal(ours.argmax(1), expected.argmax(1))
    assert torch.isinf(ours[:, 5]).all() and torch.isinf(expected[:, 5]).all()
    torch.testing.assert_close(ours[:, :5], expected[:, :5], rtol=1e-5, atol=1e-6)


# ---- knn ---------------------------------------------------------------------------------------
def brute_force_knn(query: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, k: int) -> list[int]:
    """Majority vote of the k most cosine-similar keys; ties to the larger summed similarity."""
    predictions = []
    for q in query.tolist():
        sims = []
        for key, label in zip(keys.tolist(), labels.tolist()):
            dot = sum(a * b for a, b in zip(q, key))
            norm = (sum(a * a for a in q) ** 0.5) * (sum(b * b for b in key) ** 0.5)
            sims.append((dot / norm, label))
        top = sorted(sims, key=lambda s: -s[0])[:k]
        tally: dict[int, list[float]] = {}
        for sim, label in top:
            tally.setdefault(label, [0, 0.0])
            tally[label][0] += 1
            tally[label][1] += sim
        predictions.append(max(tally, key=lambda c: (tally[c][0], tally[c][1])))
    return predictions


def test_knn_matches_brute_force_and_holds_qoas_buffer(stream, tmp_path):
    config = KNNConfig(buffer_size=12, k=5, seed=3)  # 40 examples into 12 slots: reservoir replacement
    model = fit(config, stream)
    assert model.trainable_parameters() == [] and len(model.method.buffer) == 12
    items = model.method.buffer.contents()
    test_x = features_of(model, all_test(stream))
    model.eval()
    with torch.no_grad():
        logits = model(features=test_x).logits
    assert logits.argmax(1).tolist() == brute_force_knn(test_x, items["features"], items["labels"], k=5)
    assert logits.shape == (len(test_x), 4) and (logits.round().sum(1) == 5).all()  # 5 votes per query
    # The same reservoir as QOA with the same buffer_size and seed: the same stored items.
    qoa = fit(QoaConfig(buffer_size=12, seed=3, support_size=4, hidden_size=8, max_classes=4), stream)
    for name, value in qoa.method.buffer.contents().items():
        assert torch.equal(items[name], value), name
    # Saved and reloaded: the same buffer, the same predictions.
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(features=test_x).logits, logits)


def test_knn_ties_go_to_the_larger_summed_similarity():
    from hf_clroute.baselines.knn import knn_logits

    keys = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.8]])
    labels = torch.tensor([0, 0, 1, 1])
    query = torch.tensor([[1.0, 0.05], [0.05, 1.0]])
    logits = knn_logits(query, keys, labels, k=4, num_classes=3)  # 2 votes each: similarity decides
    assert logits.argmax(1).tolist() == [0, 1]
    assert logits[:, :2].round().tolist() == [[2.0, 2.0], [2.0, 2.0]] and (logits[:, 2] == 0).all()
    one_more_vote = knn_logits(torch.tensor([[1.0, 0.0]]), keys[:3], labels[:3], k=3, num_classes=2)
    assert one_more_vote.argmax(1).tolist() == [0]
