"""Cumulative per-class Gaussian statistics of features, and sampling from them.

Old classes are rehearsed from statistics instead of stored inputs: every
training feature is folded into exact streaming sums (count and sum per class,
one shared sum of outer products), never decayed, so task 0 counts as much at
the end of the stream as it did when it was seen. The class means and the
pooled within-class covariance derived from the sums are the same numbers a
batch fit over all the features would give (up to float64 rounding).

Sums are float64: the shared second moment of thousands of features loses the
small within-class spread to cancellation in float32.
"""

from __future__ import annotations

import torch
from torch import nn


class ClassStatistics(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.register_buffer("counts", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("sums", torch.zeros(0, dim, dtype=torch.float64))
        self.register_buffer("outer", torch.zeros(dim, dim, dtype=torch.float64))

    @property
    def num_classes(self) -> int:
        return len(self.counts)

    def resize(self, num_classes: int) -> None:
        """Make room for ``num_classes`` classes (existing sums are kept; never shrinks)."""
        extra = num_classes - self.num_classes
        if extra > 0:
            self.counts = torch.cat([self.counts, self.counts.new_zeros(extra)])
            self.sums = torch.cat([self.sums, self.sums.new_zeros(extra, self.dim)])

    @torch.no_grad()
    def update(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        if len(labels) == 0:
            return
        self.resize(int(labels.max()) + 1)
        x = features.to(self.sums)
        labels = labels.to(self.sums.device)
        self.counts.index_add_(0, labels, torch.ones_like(labels, dtype=self.counts.dtype))
        self.sums.index_add_(0, labels, x)
        self.outer.add_(x.T @ x)

    def seen(self) -> torch.Tensor:
        """Ids of the classes with at least one feature."""
        return torch.nonzero(self.counts > 0).flatten()

    def means(self) -> torch.Tensor:
        return self.sums / self.counts.clamp_min(1).unsqueeze(1)

    def covariance(self) -> torch.Tensor:
        """Pooled within-class covariance: (sum x x^T - sum_c n_c mu_c mu_c^T) / (N - C)."""
        seen = self.seen()
        n, c = float(self.counts.sum()), len(seen)
        if n <= c:
            return torch.zeros_like(self.outer)
        means = self.means()[seen]
        between = (means * self.counts[seen].unsqueeze(1)).T @ means
        return (self.outer - between) / (n - c)

    def sampler(self, shrinkage: float) -> torch.Tensor:
        """Cholesky factor L of the covariance shrunk towards a scaled identity:
        (1 - s) Sigma + s (tr Sigma / d) I. The shrinkage keeps it positive definite while
        the covariance is still rank-deficient (fewer features than dimensions)."""
        cov = self.covariance()
        scale = float(torch.diagonal(cov).mean()) if self.dim else 0.0
        eye = torch.eye(self.dim, dtype=cov.dtype, device=cov.device)
        shrunk = (1 - shrinkage) * cov + (shrinkage * scale + 1e-8) * eye
        return torch.linalg.cholesky(shrunk)

    def sample(
        self, classes: torch.Tensor, per_class: int, shrinkage: float, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``per_class`` draws from N(mu_c, shrunk Sigma) for each of ``classes``: (features, labels)."""
        labels = classes.repeat_interleave(per_class)
        noise = torch.randn(len(labels), self.dim, generator=generator, dtype=torch.float64)
        factor = self.sampler(shrinkage)
        samples = self.means()[labels] + noise.to(factor.device) @ factor.T
        return samples.float(), labels
