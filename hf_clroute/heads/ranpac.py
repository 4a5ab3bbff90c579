"""RanPAC-style head: a fixed random projection, then a ridge regression readout."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .base import FLOAT, StatisticsHead, check_choice, check_int, check_number

NONLINEARITIES = ("relu", "none")


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
    ) -> None:
        super().__init__(
            in_features,
            num_classes,
            projection_dim=projection_dim,
            ridge_lambda=ridge_lambda,
            nonlinearity=nonlinearity,
            seed=seed,
        )

    def _configure(
        self, *, projection_dim: int, ridge_lambda: float, nonlinearity: str, seed: int
    ) -> None:
        self.projection_dim = check_int("projection_dim", projection_dim, minimum=1)
        self.ridge_lambda = _check_lambda("ridge_lambda", ridge_lambda)
        self.nonlinearity = check_choice("nonlinearity", nonlinearity, NONLINEARITIES)
        self.seed = check_int("seed", seed, minimum=0)

    def settings(self) -> dict:
        return {
            "projection_dim": self.projection_dim,
            "ridge_lambda": self.ridge_lambda,
            "nonlinearity": self.nonlinearity,
            "seed": self.seed,
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
        eye = torch.eye(self.projection_dim, dtype=FLOAT, device=self.gram.device)
        readout = torch.linalg.solve(self.gram + self.ridge_lambda * eye, self.class_sums)
        self.readout = readout.contiguous()

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
        _, y = self._check_batch(features, labels)
        if not bool((self.counts > 0).any()):
            raise ValueError("select_lambda needs synced statistics: accumulate and sync first")
        eigenvalues, vectors = torch.linalg.eigh(self.gram)
        projected = self.project(features) @ vectors
        targets = vectors.T @ self.class_sums
        unseen = self.counts == 0
        best, best_accuracy = lambdas[0], -1.0
        for lam in lambdas:  # ascending, and ">=" so that ties go to the larger lambda
            logits = (projected / (eigenvalues + lam)) @ targets
            predictions = logits.masked_fill(unseen, float("-inf")).argmax(1)
            accuracy = float((predictions == y).to(FLOAT).mean()) if y.numel() else 0.0
            if accuracy >= best_accuracy:
                best, best_accuracy = lam, accuracy
        self.ridge_lambda = best
        self._solve()
        return best


def _check_lambda(name: str, value: float) -> float:
    value = check_number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value

