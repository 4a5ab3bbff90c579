"""Closed-form statistics heads: exact, order-free, one pass, and the same on 1 or N processes.

Each head is checked against a batch fit written directly with torch.linalg on
all samples at once, so the streaming sums, the sync protocol and the solve
are tested together. Features are float64 so tolerances can be tight.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from hf_clroute.heads import (
    HEAD_KINDS,
    IncrementalClassifier,
    PrototypeHead,
    RandomProjectionRidgeHead,
    StatisticsHead,
    StreamingLDAHead,
    build_head,
)

D, K = 6, 4
TOL = {"rtol": 1e-9, "atol": 1e-8}

HEADS = {
    "prototype-cosine": ("prototype", {"metric": "cosine"}),
    "prototype-euclidean": ("prototype", {"metric": "euclidean"}),
    "lda": ("lda", {"shrinkage": 0.1}),
    "lda-no-shrinkage": ("lda", {"shrinkage": 0.0}),
    "ranpac-relu": ("ranpac", {"projection_dim": 32, "ridge_lambda": 0.5, "seed": 3}),
    "ranpac-linear": ("ranpac", {"projection_dim": 8, "ridge_lambda": 2.0, "nonlinearity": "none"}),
}


def _make(name: str, num_classes: int = K, **overrides) -> StatisticsHead:
    kind, options = HEADS[name]
    return build_head(kind, D, num_classes=num_classes, **{**options, **overrides})


def _data(n: int = 120, seed: int = 0, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian classes with distinct means; every class present."""
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(k, D, generator=g, dtype=torch.float64)
    y = torch.cat([torch.arange(k), torch.randint(0, k, (n - k,), generator=g)])
    x = centres[y] + torch.randn(n, D, generator=g, dtype=torch.float64)
    return x, y


def _fit(head: StatisticsHead, x: torch.Tensor, y: torch.Tensor, batch: int = 16) -> StatisticsHead:
    for xb, yb in zip(x.split(batch), y.split(batch)):
        head.accumulate(xb, yb)
    head.sync()
    return head


def _probe() -> torch.Tensor:
    return _data(40, seed=99)[0]


def _reference_logits(
    name: str, head: StatisticsHead, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor
) -> torch.Tensor:
    """Batch fit on all samples at once, written directly from the definitions."""
    means = torch.stack([x[y == c].mean(0) for c in range(K)])
    if name.startswith("prototype"):
        if head.metric == "cosine":
            return F.normalize(xt, dim=1) @ F.normalize(means, dim=1).T
        return -torch.cdist(xt, means).square()
    if name.startswith("lda"):
        centred = x - means[y]
        cov = centred.T @ centred / (len(x) - K)
        s = head.shrinkage
        cov = (1 - s) * cov + s * torch.trace(cov) / D * torch.eye(D, dtype=torch.float64)
        weight = torch.linalg.solve(cov, means.T)  # (D, K)
        return xt @ weight - 0.5 * (means.T * weight).sum(0)
    relu = head.nonlinearity == "relu"
    h = x @ head.projection
    ht = xt @ head.projection
    h, ht = (h.relu(), ht.relu()) if relu else (h, ht)
    eye = torch.eye(h.shape[1], dtype=torch.float64)
    readout = torch.linalg.solve(h.T @ h + head.ridge_lambda * eye, h.T @ F.one_hot(y, K).double())
    return ht @ readout


@pytest.mark.parametrize("name", HEADS)
def test_equals_batch_fit_on_all_data(name: str) -> None:
    x, y = _data()
    head = _fit(_make(name), x, y)
    xt = _probe()
    torch.testing.assert_close(head(xt), _reference_logits(name, head, x, y, xt), **TOL)


@pytest.mark.parametrize("name", HEADS)
def test_invariant_to_stream_order(name: str) -> None:
    x, y = _data()
    ordered = _fit(_make(name), x, y, batch=16)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    shuffled = _fit(_make(name), x[perm], y[perm], batch=7)
    sorted_by_class = y.argsort(stable=True).flip(0)
    by_class = _fit(_make(name), x[sorted_by_class], y[sorted_by_class], batch=50)
    xt = _probe()
    torch.testing.assert_close(shuffled(xt), ordered(xt), **TOL)
    torch.testing.assert_close(by_class(xt), ordered(xt), **TOL)


@pytest.mark.parametrize("name", HEADS)
def test_syncs_in_between_equal_one_sync_at_end(name: str) -> None:
    x, y = _data()
    xt = _probe()
    once = _fit(_make(name), x, y, batch=5)
    often = _make(name)
    for xb, yb in zip(x.split(5), y.split(5)):
        before = often(xt)
        often.accumulate(xb, yb)
        assert torch.equal(often(xt), before)  # pending sums do not change predictions
        often.sync()
    torch.testing.assert_close(often(xt), once(xt), **TOL)
    for stat in once.statistic_names():
        torch.testing.assert_close(getattr(often, stat), getattr(once, stat), **TOL)
    assert torch.equal(often.counts, torch.bincount(y, minlength=K).double())


@pytest.mark.parametrize("name", HEADS)
def test_safetensors_round_trip_is_bit_identical(name: str, tmp_path) -> None:
    x, y = _data()
    head = _fit(_make(name), x, y)
    head.grow(K + 1)  # an unseen class round-trips too
    path = tmp_path / "head.safetensors"
    save_file(head.state_dict(), str(path))
    state = json.loads(json.dumps(head.extra_state()))
    kind, _ = HEADS[name]
    # A fresh head of the default shape and settings: load_extra_state resizes it.
    fresh = build_head(kind, D)
    fresh.load_extra_state(state)
    fresh.load_state_dict(load_file(str(path)))
    xt = _probe()
    assert torch.equal(fresh(xt), head(xt))
    assert torch.equal(fresh(xt.float()), head(xt.float()))
    assert fresh.extra_state() == head.extra_state()
    # The stored settings rebuild the head's shape directly too.
    rebuilt = build_head(**state)
    rebuilt.load_state_dict(load_file(str(path)))
    assert torch.equal(rebuilt(xt), head(xt))
    # And further statistics fold in the same way on the loaded head.
    x2, y2 = _data(30, seed=5)
    head.accumulate(x2, y2)
    fresh.accumulate(x2, y2)
    head.sync()
    fresh.sync()
    assert torch.equal(fresh(xt), head(xt))


def _simulated_reducers(heads: list[StatisticsHead]) -> tuple[list, list[int]]:
    """One ``reduce`` per simulated process: the sum of every process's pending tensor.

    Snapshots every process's pending sums before the sync, then answers the
    i-th call of each process with the sum of the i-th pending tensors.
    """
    snapshots = [[t.clone() for t in h.pending_statistics().values()] for h in heads]
    calls = [0] * len(heads)

    def reducer(rank: int):
        index = itertools.count()

        def reduce(tensor: torch.Tensor) -> torch.Tensor:
            i = next(index)
            calls[rank] += 1
            assert torch.equal(tensor, snapshots[rank][i])
            return sum(s[i] for s in snapshots)

        return reduce

    return [reducer(rank) for rank in range(len(heads))], calls


@pytest.mark.parametrize("name", HEADS)
def test_two_processes_equal_one(name: str) -> None:
    x, y = _data(150)
    single = _fit(_make(name), x, y, batch=10)
    ranks = [_make(name), _make(name)]
    # Three sync rounds over disjoint shards; in the last round rank 1 has no data.
    rounds = [
        (slice(0, 40), slice(40, 90)),
        (slice(90, 120), slice(120, 140)),
        (slice(140, 150), None),
    ]
    for shard_a, shard_b in rounds:
        for head, shard in zip(ranks, (shard_a, shard_b)):
            if shard is not None:
                for xb, yb in zip(x[shard].split(10), y[shard].split(10)):
                    head.accumulate(xb, yb)
        reducers, calls = _simulated_reducers(ranks)
        for head, reduce in zip(ranks, reducers):
            head.sync(reduce)
        assert calls == [len(ranks[0].statistic_names())] * 2  # collectives line up
    xt = _probe()
    assert torch.equal(ranks[0](xt), ranks[1](xt))
    torch.testing.assert_close(ranks[0](xt), single(xt), **TOL)


def test_in_place_reduce_returning_none() -> None:
    """A reducer like torch.distributed.all_reduce sums in place and returns None."""
    x, y = _data()
    single = _fit(_make("lda"), x, y)
    head = _make("lda")
    head.accumulate(x[:60], y[:60])
    other = _make("lda")
    other.accumulate(x[60:], y[60:])
    extra = iter(list(other.pending_statistics().values()))

    def all_reduce(tensor: torch.Tensor) -> None:
        tensor.add_(next(extra))

    head.sync(all_reduce)
    torch.testing.assert_close(head(_probe()), single(_probe()), **TOL)


@pytest.mark.parametrize("name", HEADS)
def test_growth_keeps_statistics_and_masks_unseen_classes(name: str) -> None:
    x, y = _data()
    head = _fit(_make(name, num_classes=K), x, y)
    xt = _probe()
    before = head(xt)
    old = {n: t.clone() for n, t in head.state_dict().items()}
    head.grow(K + 2)
    assert head.num_classes == K + 2
    for n, t in old.items():  # old entries bit-identical, new ones zero
        new = head.state_dict()[n]
        corner = tuple(slice(0, s) for s in t.shape)
        outside = torch.ones_like(new, dtype=torch.bool)
        outside[corner] = False
        assert torch.equal(new[corner], t) and not new[outside].any()
    after = head(xt)
    torch.testing.assert_close(after[:, :K], before, rtol=0, atol=1e-12)
    assert torch.isneginf(after[:, K:]).all()
    # Pending sums survive growth; a new class becomes finite once synced.
    x_new = _data(12, seed=7)[0] + 5.0
    head.accumulate(x_new, torch.full((12,), K + 1))
    head.grow(K + 3)
    head.sync()
    logits = head(xt)
    assert torch.isneginf(logits[:, [K, K + 2]]).all()
    assert torch.isfinite(logits[:, : K]).all() and torch.isfinite(logits[:, K + 1]).all()
    # Growing first, then seeing the same data, gives the same head.
    twin = _fit(_make(name, num_classes=K + 3), x, y)
    twin.accumulate(x_new, torch.full((12,), K + 1))
    twin.sync()
    torch.testing.assert_close(twin(xt), logits, **TOL)
    with pytest.raises(ValueError, match="cannot shrink"):
        head.grow(2)
    with pytest.raises(ValueError, match="grow the head first"):
        head.accumulate(x[:2], torch.tensor([0, K + 3]))


@pytest.mark.parametrize("kind", ["prototype", "lda", "ranpac"])
def test_empty_head_and_dtype(kind: str) -> None:
    head = build_head(kind, D)
    assert head.num_classes == 0 and head(torch.randn(3, D)).shape == (3, 0)
    head.grow(2)
    logits = head(torch.randn(3, D))
    assert logits.dtype == torch.float32 and torch.isneginf(logits).all()
    head.accumulate(torch.randn(4, D), torch.tensor([0, 0, 1, 1]))
    head.sync()
    half = head(torch.randn(3, D, dtype=torch.bfloat16))
    # bf16 features (under autocast) give float32 logits: bf16 would round close scores into argmax ties
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    assert all(t.dtype == torch.float64 for t in head.state_dict().values())
    with pytest.raises(ValueError, match="features must have shape"):
        head.accumulate(torch.randn(4, D + 1), torch.tensor([0, 0, 1, 1]))


def test_random_projection_is_a_function_of_the_seed() -> None:
    a = RandomProjectionRidgeHead(D, projection_dim=16, seed=1, num_classes=K)
    b = RandomProjectionRidgeHead(D, projection_dim=16, seed=1, ridge_lambda=3.0)
    c = RandomProjectionRidgeHead(D, projection_dim=16, seed=2, num_classes=K)
    assert a.projection.shape == (D, 16) and a.projection.dtype == torch.float64
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(a.projection, c.projection)
    assert "projection" in a.state_dict()  # saved with the head
    x, y = _data()
    xt = _probe()
    assert not torch.allclose(_fit(a, x, y)(xt), _fit(c, x, y)(xt))


def _imbalanced(n0: int, n1: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.zeros(2, D, dtype=torch.float64)
    centres[0, 0], centres[1, :2] = 1.0, 0.7
    y = torch.cat([torch.zeros(n0, dtype=torch.long), torch.ones(n1, dtype=torch.long)])
    return centres[y] + 0.1 * torch.randn(n0 + n1, D, generator=g, dtype=torch.float64), y


def _accuracy(head: StatisticsHead, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((head(x).argmax(1) == y).double().mean())


def test_select_lambda_picks_the_best_on_held_out_data() -> None:
    # Class 0 has 20x the examples: a huge lambda shrinks the readout to C / lambda,
    # which scores by class sums and so predicts the majority class everywhere.
    x, y = _imbalanced(400, 20, seed=0)
    small, large = 1e-3, 1e6
    candidates = [large, 1.0, small]

    def fitted(lam: float) -> RandomProjectionRidgeHead:
        head = RandomProjectionRidgeHead(D, projection_dim=64, ridge_lambda=lam, num_classes=2)
        return _fit(head, x, y, batch=64)

    balanced_x, balanced_y = _imbalanced(100, 100, seed=1)
    # Held out with true labels: the small lambda separates the classes, the large does not.
    acc = {lam: _accuracy(fitted(lam), balanced_x, balanced_y) for lam in candidates}
    assert acc[small] > 0.9 and acc[large] < 0.6
    head = fitted(10.0)
    chosen = head.select_lambda(balanced_x, balanced_y, candidates)
    best = max(acc.values())
    assert chosen == max(lam for lam in candidates if acc[lam] == best) and chosen != large
    assert head.ridge_lambda == chosen
    assert torch.equal(head(balanced_x), fitted(chosen)(balanced_x))  # as sync would solve it
    # Held out where every example is labelled with the majority class: the large lambda wins.
    majority_y = torch.zeros_like(balanced_y)
    assert _accuracy(fitted(large), balanced_x, majority_y) == 1.0
    assert _accuracy(fitted(small), balanced_x, majority_y) < 0.6
    assert head.select_lambda(balanced_x, majority_y, candidates) == large
    # Ties go to the larger lambda: two huge lambdas both predict the majority class.
    assert head.select_lambda(balanced_x, majority_y, [1e5, 1e6, 1e7]) == 1e7
    with pytest.raises(ValueError, match="candidates"):
        head.select_lambda(balanced_x, balanced_y, [])
    with pytest.raises(ValueError, match="candidates must be > 0, got -1.0"):
        head.select_lambda(balanced_x, balanced_y, [1.0, -1.0])
    with pytest.raises(ValueError, match="sync first"):
        RandomProjectionRidgeHead(D, num_classes=2).select_lambda(balanced_x, balanced_y, [1.0])


def test_lda_with_full_shrinkage_is_nearest_mean_under_identity() -> None:
    x, y = _data()
    lda = _fit(StreamingLDAHead(D, shrinkage=1.0, num_classes=K), x, y)
    ncm = _fit(PrototypeHead(D, metric="euclidean", num_classes=K), x, y)
    xt = _probe()
    # Sigma_s = a I with a = tr(Sigma)/d, so logit_c = (x.mu_c - |mu_c|^2 / 2) / a
    # = (-|x - mu_c|^2 + |x|^2) / (2a): the same per-row ordering as NCM.
    a = torch.trace(lda.covariance()) / D
    torch.testing.assert_close(lda.covariance(), a * torch.eye(D, dtype=torch.float64), **TOL)
    torch.testing.assert_close(2 * a * lda(xt) - xt.square().sum(1, keepdim=True), ncm(xt), **TOL)
    assert torch.equal(lda(xt).argsort(1), ncm(xt).argsort(1))
    # Full shrinkage also copes with fewer examples than dimensions.
    few = _fit(StreamingLDAHead(D, shrinkage=1.0, num_classes=K), x[:5], y[:5])
    assert torch.isfinite(few(xt)[:, y[:5].unique()]).all()


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("lda", {"shrinkage": 1.5}, r"shrinkage must be in \[0, 1\], got 1.5"),
        ("lda", {"shrinkage": -0.1}, r"shrinkage must be in \[0, 1\], got -0.1"),
        ("lda", {"shrinkage": float("nan")}, "shrinkage must be a finite number"),
        ("prototype", {"metric": "l1"}, "metric must be one of 'cosine', 'euclidean', got 'l1'"),
        ("ranpac", {"ridge_lambda": 0}, "ridge_lambda must be > 0, got 0"),
        ("ranpac", {"projection_dim": 0}, "projection_dim must be an integer >= 1, got 0"),
        ("ranpac", {"nonlinearity": "tanh"}, "nonlinearity must be one of 'relu', 'none'"),
        ("ranpac", {"seed": 1.5}, "seed must be an integer"),
        ("lda", {"num_classes": -1}, "num_classes must be an integer >= 0, got -1"),
        ("lda", {"metric": "cosine"}, "unknown option.*metric.*head kind 'lda'"),
        ("bogus", {}, "unknown head kind 'bogus'; known kinds: linear, prototype, lda, ranpac"),
    ],
)
def test_bad_options_raise_value_error_naming_the_option(
    kind: str, options: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_head(kind, D, **options)


def test_build_head_kinds_and_state_checks() -> None:
    assert HEAD_KINDS == ("linear", "prototype", "lda", "ranpac", "cosine")
    linear = build_head("linear", D, num_classes=3)
    assert isinstance(linear, IncrementalClassifier) and linear.num_classes == 3
    classes = [PrototypeHead, StreamingLDAHead, RandomProjectionRidgeHead]
    for kind, cls in zip(HEAD_KINDS[1:], classes):
        head = build_head(kind, D)
        assert isinstance(head, cls) and head.kind == kind
    with pytest.raises(ValueError, match="in_features must be an integer >= 1"):
        PrototypeHead(0)
    with pytest.raises(ValueError, match="not 'prototype'"):
        PrototypeHead(D).load_extra_state(StreamingLDAHead(D).extra_state())
    with pytest.raises(ValueError, match="in_features"):
        PrototypeHead(D).load_extra_state(PrototypeHead(D + 1).extra_state())
    with pytest.raises(ValueError, match="shrinkage"):
        StreamingLDAHead(D).load_extra_state({"kind": "lda", "num_classes": 2, "shrinkage": 2.0})
    with pytest.raises(ValueError, match="unknown setting.*metric"):
        StreamingLDAHead(D).load_extra_state({"kind": "lda", "metric": "cosine"})


def test_ranpac_gcv_scores_equal_the_hat_matrix_definition_and_choose_the_solve() -> None:
    x, y = _data(60)
    head = _fit(RandomProjectionRidgeHead(D, projection_dim=32, num_classes=K, lambda_mode="gcv", gcv_min_classes=K),
                x, y)
    lambdas = [1e-3, 1e-1, 1.0, 10.0, 100.0, 1e4]
    h, targets, n = (x @ head.projection).relu(), F.one_hot(y, K).double(), len(x)
    eye = torch.eye(32, dtype=torch.float64)
    expected = []
    for lam in lambdas:  # GCV = n ||(I - A) Y||^2 / trace(I - A)^2, A the ridge hat matrix
        hat = h @ torch.linalg.solve(h.T @ h + lam * eye, h.T)
        expected.append(n * (targets - hat @ targets).square().sum() / (n - torch.trace(hat)) ** 2)
    torch.testing.assert_close(head.gcv_scores(lambdas), torch.stack(expected), rtol=1e-8, atol=0)
    # The solve used the grid's GCV minimum, interior to the grid, and equals a fixed head at that lambda.
    from hf_clroute.heads.ranpac import GCV_GRID

    grid = [c * head.mean_eigenvalue() for c in GCV_GRID]
    scores = head.gcv_scores(grid)
    assert head.solved_lambda == grid[int(scores.argmin())] and grid[0] < head.solved_lambda < grid[-1]
    fixed = _fit(RandomProjectionRidgeHead(D, projection_dim=32, num_classes=K, ridge_lambda=head.solved_lambda), x, y)
    torch.testing.assert_close(head(_probe()), fixed(_probe()), **TOL)
    # Fewer examples than projected dimensions: a tiny lambda interpolates (df >= n), so GCV never picks it.
    few = _fit(RandomProjectionRidgeHead(D, projection_dim=32, num_classes=K, lambda_mode="gcv", gcv_min_classes=1),
               x[:12], y[:12])
    assert torch.isinf(few.gcv_scores([1e-9 * few.mean_eigenvalue()])).all()
    assert torch.isfinite(few.gcv_scores([few.solved_lambda])).all()


def test_ranpac_relative_lambda_is_in_units_of_the_mean_eigenvalue() -> None:
    # ReLU(10 x W) = 10 ReLU(x W): G grows 100x and C 10x. A relative lambda grows with G, so the readout
    # shrinks 10x and the logits are unchanged; a fixed lambda is 100x weaker on the scaled features.
    x, y = _data()
    xt = _probe()

    def logits(mode: str, scale: float) -> torch.Tensor:
        head = RandomProjectionRidgeHead(D, projection_dim=32, ridge_lambda=0.5, lambda_mode=mode, num_classes=K)
        return _fit(head, scale * x, y)(scale * xt)

    torch.testing.assert_close(logits("relative", 10.0), logits("relative", 1.0), **TOL)
    assert not torch.allclose(logits("fixed", 10.0), logits("fixed", 1.0))
    head = _fit(RandomProjectionRidgeHead(D, projection_dim=32, ridge_lambda=0.5, lambda_mode="relative",
                                          num_classes=K), x, y)
    trace = float(torch.diagonal(head.gram).sum())
    assert head.solved_lambda == pytest.approx(0.5 * trace / 32)
    with pytest.raises(ValueError, match="lambda_mode must be one of 'fixed', 'relative', 'gcv', got 'auto'"):
        RandomProjectionRidgeHead(D, lambda_mode="auto")


def test_ranpac_gcv_solves_with_the_relative_lambda_until_enough_classes_are_in() -> None:
    # Early in a stream (a 2-class first task) GCV's lambda is not trusted: the head solves with its relative
    # ridge_lambda, exactly as the "relative" head does, and reads those two classes; from gcv_min_classes
    # classes on, GCV chooses again.
    x, y = _data(200, k=6)
    first = y < 2
    gcv = RandomProjectionRidgeHead(D, projection_dim=32, ridge_lambda=0.01, lambda_mode="gcv", num_classes=6,
                                    gcv_min_classes=3)
    relative = RandomProjectionRidgeHead(D, projection_dim=32, ridge_lambda=0.01, lambda_mode="relative", num_classes=6)
    _fit(gcv, x[first], y[first]), _fit(relative, x[first], y[first])
    assert gcv.solved_by == "relative" and gcv.solved_lambda == pytest.approx(0.01 * gcv.mean_eigenvalue())
    torch.testing.assert_close(gcv(x[first]), relative(x[first]), **TOL)
    assert _accuracy(gcv, x[first], y[first]) > 0.9
    _fit(gcv, x[~first & (y < 3)], y[~first & (y < 3)])  # a third class: enough for GCV
    assert gcv.solved_by == "gcv" and gcv.solved_lambda == gcv.gcv_lambda()
    assert RandomProjectionRidgeHead(D, lambda_mode="gcv").settings()["gcv_min_classes"] == 5  # the default
    with pytest.raises(ValueError, match="gcv_min_classes"):
        RandomProjectionRidgeHead(D, lambda_mode="gcv", gcv_min_classes=0)
