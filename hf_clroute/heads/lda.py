"""Streaming linear discriminant analysis: class means and one shared covariance."""

from __future__ import annotations

import torch

from hf_clroute.heads.base import FLOAT, StatisticsHead, check_number


class StreamingLDAHead(StatisticsHead):
    """Gaussian classes with a shared, shrunk covariance (streaming LDA).

    Statistics: counts ``n_c``, class sums ``s_c`` and the total second moment
    ``S = sum_i x_i x_i^T`` over all classes. From them, without a second pass:

    * class means ``mu_c = s_c / n_c``;
    * pooled within-class covariance
      ``Sigma = (S - sum_c s_c s_c^T / n_c) / (N - K_seen)``, i.e. the scatter of
      each example about its own class mean (``N`` examples, ``K_seen`` classes
      with examples; the denominator is at least 1);
    * shrinkage ``Sigma_s = (1 - s) Sigma + s (tr(Sigma)/d) I``, which keeps
      ``Sigma_s`` invertible when there are fewer examples than dimensions; at
      ``s = 1`` the head is a nearest-mean classifier under the identity metric.

    ``logit_c = x^T Sigma_s^-1 mu_c - mu_c^T Sigma_s^-1 mu_c / 2`` (the Gaussian
    log-likelihood up to terms shared by all classes; no class prior). Cached as
    ``weight`` (K, d) and ``bias`` (K,). Before any within-class spread is seen
    (``tr(Sigma) = 0``) the identity stands in for ``Sigma``.

    Forming ``S - sum_c s_c s_c^T / n_c`` cancels large terms when features sit
    far from the origin; float64 keeps this well below prediction-changing
    error for typical (normalised or O(1)-scaled) backbone features.
    """

    kind = "lda"

    def __init__(
        self, in_features: int, *, shrinkage: float = 1e-4, num_classes: int = 0
    ) -> None:
        super().__init__(in_features, num_classes, shrinkage=shrinkage)

    def _configure(self, *, shrinkage: float) -> None:
        shrinkage = check_number("shrinkage", shrinkage)
        if not 0.0 <= shrinkage <= 1.0:
            raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")
        self.shrinkage = shrinkage

    def settings(self) -> dict:
        return {"shrinkage": self.shrinkage}

    @torch.no_grad()
    def set_shrinkage(self, shrinkage: float) -> None:
        """Re-solve the synced statistics at another ``shrinkage`` (a search over shrinkages accumulates once)."""
        self._configure(shrinkage=shrinkage)
        if bool((self.counts > 0).any()):
            self._solve()

    def _statistic_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        d = self.in_features
        return {"sums": (k, d), "second_moment": (d, d)}

    def _solution_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {"weight": (k, self.in_features), "bias": (k,)}

    def _accumulate(self, pending: dict, x: torch.Tensor, onehot: torch.Tensor) -> None:
        pending["sums"] += onehot.T @ x
        pending["second_moment"] += x.T @ x

    def covariance(self) -> torch.Tensor:
        """The shrunk pooled within-class covariance ``Sigma_s`` (d, d)."""
        d = self.in_features
        counts = self.counts.clamp(min=1)
        within = self.second_moment - (self.sums.T / counts) @ self.sums
        dof = max(float(self.counts.sum()) - int((self.counts > 0).sum()), 1.0)
        cov = (within + within.T) / (2 * dof)
        eye = torch.eye(d, dtype=FLOAT, device=cov.device)
        scale = torch.trace(cov) / d
        if scale <= 0:
            return eye
        return (1 - self.shrinkage) * cov + self.shrinkage * scale * eye

    def _solve(self) -> None:
        means = self.sums / self.counts.clamp(min=1).unsqueeze(1)
        cov = self.covariance()
        chol, info = torch.linalg.cholesky_ex(cov)
        if int(info) == 0:
            weight = torch.cholesky_solve(means.T, chol).T
        else:  # singular (shrinkage 0 with too few examples): least-norm solution
            weight = (torch.linalg.pinv(cov, hermitian=True) @ means.T).T
        self.weight = weight.contiguous()
        self.bias = (-0.5 * (weight * means).sum(1)).contiguous()

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.bias
