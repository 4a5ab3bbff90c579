"""RanPAC-style head: a fixed random projection, then a ridge regression readout."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from hf_clroute.heads.base import (
    FLOAT,
    StatisticsHead,
    check_choice,
    check_int,
    check_number,
)

NONLINEARITIES = ("relu", "none")
LAMBDA_MODES = ("fixed", "relative", "gcv")
#: GCV's candidates, relative to the mean eigenvalue trace(G) / M: 10^-8 .. 10^8 in half decades,
#: wide enough that the chosen lambda is interior on any backbone (RanPAC searches 10^-8 .. 10^13).
GCV_GRID = tuple(10.0 ** (e / 2) for e in range(-16, 17))
#: below this many classes seen, a "gcv" head solves with its relative ``ridge_lambda`` instead
GCV_MIN_CLASSES = 5


class RandomProjectionRidgeHead(StatisticsHead):
    """Ridge regression to one-hot targets on randomly projected features.

    ``h = phi(x W)`` with ``W`` (d, M) i.i.d. standard Gaussian drawn from a
    ``torch.Generator`` seeded with ``seed`` (a persistent float64 buffer
    ``projection``, so it saves with the head) and ``phi`` ReLU or identity.
    The projection lifts the features to M dimensions where classes separate
    more linearly; ``W`` never trains, so the head stays closed-form.

    Statistics: the Gram matrix ``G = sum h h^T`` (M, M) and the class sums
    ``C = sum h y^T`` (M, K) with one-hot ``y``. Solution:
    ``readout = (G + lambda I)^-1 C`` (M, K); ``logits = h @ readout``.
    ``G`` costs ``M^2`` float64 values (RanPAC itself uses M = 10 000: 800 MB).

    ``lambda_mode`` sets the lambda of each solve: ``"fixed"`` uses ``ridge_lambda``;
    ``"relative"`` uses ``ridge_lambda * trace(G) / M`` (lambda in units of G's mean
    eigenvalue, so one grid of ``ridge_lambda`` spans the same part of the spectrum on
    every backbone and stream length); ``"gcv"`` chooses it at every solve by generalized
    cross-validation from the statistics alone (:meth:`gcv_lambda`, over ``GCV_GRID``
    times trace(G) / M): RanPAC's own closed-form choice of lambda on the training data,
    with no validation split. ``solved_lambda`` is the lambda the last solve used.

    GCV early in a stream: chosen on the statistics of a handful of classes, GCV's lambda can leave
    the readout far below a tuned one on them (seen on the first tasks of a stream of 2-class tasks,
    while the final accuracy matched). Until ``gcv_min_classes`` classes have examples, ``"gcv"``
    solves with the relative lambda ``ridge_lambda * trace(G) / M`` instead (set ``ridge_lambda`` to
    the relative lambda ``hf-clroute tune`` picked for the ``"relative"`` head); ``solved_by`` says
    which rule the last solve used.
    """

    kind = "ranpac"

    def __init__(
        self,
        in_features: int,
        *,
        projection_dim: int = 2048,
        ridge_lambda: float = 1.0,
        nonlinearity: str = "relu",
        seed: int = 0,
        num_classes: int = 0,
        lambda_mode: str = "fixed",
        gcv_min_classes: int = GCV_MIN_CLASSES,
    ) -> None:
        super().__init__(
            in_features,
            num_classes,
            projection_dim=projection_dim,
            ridge_lambda=ridge_lambda,
            nonlinearity=nonlinearity,
            seed=seed,
            lambda_mode=lambda_mode,
            gcv_min_classes=gcv_min_classes,
        )
        self.solved_lambda: float | None = None  # the lambda of the last solve (set by sync)
        self.solved_by: str | None = None  # "gcv" / "relative" / "fixed": the rule of the last solve

    def _configure(
        self, *, projection_dim: int, ridge_lambda: float, nonlinearity: str, seed: int,
        lambda_mode: str = "fixed", gcv_min_classes: int = GCV_MIN_CLASSES,
    ) -> None:
        self.projection_dim = check_int("projection_dim", projection_dim, minimum=1)
        self.ridge_lambda = _check_lambda("ridge_lambda", ridge_lambda)
        self.nonlinearity = check_choice("nonlinearity", nonlinearity, NONLINEARITIES)
        self.seed = check_int("seed", seed, minimum=0)
        self.lambda_mode = check_choice("lambda_mode", lambda_mode, LAMBDA_MODES)
        self.gcv_min_classes = check_int("gcv_min_classes", gcv_min_classes, minimum=1)

    def settings(self) -> dict:
        return {
            "projection_dim": self.projection_dim,
            "ridge_lambda": self.ridge_lambda,
            "nonlinearity": self.nonlinearity,
            "seed": self.seed,
            "lambda_mode": self.lambda_mode,
            "gcv_min_classes": self.gcv_min_classes,
        }

    def _statistic_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        m = self.projection_dim
        return {"gram": (m, m), "class_sums": (m, k)}

    def _solution_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {"readout": (self.projection_dim, k)}

    def _allocate_fixed(self, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        shape = (self.in_features, self.projection_dim)
        projection = torch.randn(shape, generator=generator, dtype=FLOAT)
        self.register_buffer("projection", projection.to(device))

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``h = phi(x W)`` in float64, (B, M)."""
        h = self._check_features(features) @ self.projection
        return h.relu() if self.nonlinearity == "relu" else h

    def _accumulate(self, pending: dict, x: torch.Tensor, onehot: torch.Tensor) -> None:
        h = self.project(x)
        pending["gram"] += h.T @ h
        pending["class_sums"] += h.T @ onehot

    def _solve(self) -> None:
        mode = self.lambda_mode
        if mode == "gcv" and int((self.counts > 0).sum()) < self.gcv_min_classes:
            mode = "relative"  # too few classes for GCV's choice to be trusted (see the class docstring)
        if mode == "fixed":
            lam = self.ridge_lambda
        elif mode == "relative":
            lam = self.ridge_lambda * self.mean_eigenvalue()
        else:
            lam = self.gcv_lambda()
        self.solved_by = mode
        eye = torch.eye(self.projection_dim, dtype=FLOAT, device=self.gram.device)
        readout = torch.linalg.solve(self.gram + lam * eye, self.class_sums)
        self.readout = readout.contiguous()
        self.solved_lambda = lam

    def mean_eigenvalue(self) -> float:
        """trace(G) / M, G's mean eigenvalue: the natural unit of lambda (1.0 before any statistics)."""
        scale = float(torch.diagonal(self.gram).sum()) / self.projection_dim
        return scale if scale > 0 else 1.0

    @torch.no_grad()
    def gcv_scores(self, lambdas: Iterable[float]) -> torch.Tensor:
        """Generalized cross-validation score of each lambda, from the synced statistics alone.

        ``GCV(lambda) = n RSS / (n - df)^2`` with ``RSS = ||Y - H readout||^2`` and
        ``df = trace(H (G + lambda I)^-1 H^T)``; with ``G = V diag(e) V^T`` and ``B = V^T C``
        both are sums over the eigenvalues (``||Y||^2 = n`` for one-hot targets):
        ``RSS = n - sum (2 / (e + lambda) - e / (e + lambda)^2) |B_i|^2``,
        ``df = sum e / (e + lambda)``. GCV approximates leave-one-out squared error, so it
        chooses lambda the way a held-out split would, without holding data out.
        ``inf`` where ``df >= n`` (the fit interpolates).
        """
        lam = torch.tensor([_check_lambda("lambdas", v) for v in lambdas], dtype=FLOAT, device=self.gram.device)
        n = float(self.counts.sum())
        eigenvalues, vectors = torch.linalg.eigh(self.gram)
        e = eigenvalues.clamp_min(0)[None, :]  # round-off can leave tiny negative eigenvalues
        b2 = (vectors.T @ self.class_sums).square().sum(1)[None, :]
        inverse = 1.0 / (e + lam[:, None])
        rss = (n - ((2 * inverse - e * inverse.square()) * b2).sum(1)).clamp_min(0)
        slack = n - (e * inverse).sum(1)
        return torch.where(slack > 0, n * rss / slack.clamp_min(1e-300).square(), torch.inf)

    @torch.no_grad()
    def gcv_lambda(self) -> float:
        """The lambda of ``GCV_GRID`` x trace(G) / M with the smallest GCV score (ties: the larger)."""
        lambdas = [c * self.mean_eigenvalue() for c in GCV_GRID]
        if not float(self.counts.sum()):
            return lambdas[len(lambdas) // 2]  # no statistics: the readout is zero whatever lambda is
        scores = self.gcv_scores(lambdas).tolist()
        return min(zip(scores, lambdas), key=lambda pair: (pair[0], -pair[1]))[1]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x) @ self.readout

    @torch.no_grad()
    def select_lambda(
        self, features: torch.Tensor, labels: torch.Tensor, candidates: Iterable[float]
    ) -> float:
        """Pick the ``ridge_lambda`` with the best accuracy on held-out data and set it.

        Uses the synced statistics (pending sums are ignored). One
        eigendecomposition ``G = V diag(e) V^T`` serves every candidate:
        ``h @ readout = (h V) diag(1 / (e + lambda)) (V^T C)``. Ties go to the
        larger lambda (the smoother readout). The readout is then re-solved
        exactly as :meth:`sync` would for the chosen lambda.
        """
        lambdas = sorted(_check_lambda("candidates", c) for c in candidates)
        if not lambdas:
            raise ValueError("candidates must hold at least one lambda, got none")
        accuracy_at = self.lambda_scorer(features, labels)
        best, best_accuracy = lambdas[0], -1.0
        for lam in lambdas:  # ascending, and ">=" so that ties go to the larger lambda
            accuracy = accuracy_at(lam)
            if accuracy >= best_accuracy:
                best, best_accuracy = lam, accuracy
        self.ridge_lambda = best
        self._solve()
        return best

    @torch.no_grad()
    def set_ridge_lambda(self, ridge_lambda: float) -> None:
        """Re-solve the synced statistics at another ``ridge_lambda`` (in the head's ``lambda_mode`` units)."""
        self.ridge_lambda = _check_lambda("ridge_lambda", ridge_lambda)
        self._solve()

    @torch.no_grad()
    def lambda_scorer(self, features: torch.Tensor, labels: torch.Tensor) -> Callable[[float], float]:
        """``accuracy(lambda)``: accuracy on held-out (features, labels) of the readout solved at an absolute
        ``lambda`` from the synced statistics, without changing the head. One eigendecomposition
        ``G = V diag(e) V^T`` serves every lambda: ``h @ readout = (h V) diag(1 / (e + lambda)) (V^T C)``."""
        _, y = self._check_batch(features, labels)
        if not bool((self.counts > 0).any()):
            raise ValueError("choosing lambda needs synced statistics: accumulate and sync first")
        eigenvalues, vectors = torch.linalg.eigh(self.gram)
        projected = self.project(features) @ vectors
        targets = vectors.T @ self.class_sums
        unseen = self.counts == 0

        def accuracy(lam: float) -> float:
            logits = (projected / (eigenvalues + _check_lambda("lambda", lam))) @ targets
            predictions = logits.masked_fill(unseen, float("-inf")).argmax(1)
            return float((predictions == y).to(FLOAT).mean()) if y.numel() else 0.0

        return accuracy


def _check_lambda(name: str, value: float) -> float:
    value = check_number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value

