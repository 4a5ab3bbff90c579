"""Nearest class mean (NCM) head: one prototype per class, the mean feature."""

from __future__ import annotations

import torch
from torch import nn

from hf_clroute.heads.base import StatisticsHead, check_choice

METRICS = ("cosine", "euclidean")


class PrototypeHead(StatisticsHead):
    """Scores a feature by its similarity to each class mean ``mu_c = s_c / n_c``.

    ``metric="cosine"``: ``logit_c = <x/|x|, mu_c/|mu_c|>``. ``"euclidean"``:
    ``logit_c = -|x - mu_c|^2`` (negative squared distance, so the largest
    logit is the nearest mean). Statistics: per-class counts ``n_c`` and sums
    ``s_c``; solution: the means.
    """

    kind = "prototype"

    def __init__(self, in_features: int, *, metric: str = "cosine", num_classes: int = 0) -> None:
        super().__init__(in_features, num_classes, metric=metric)

    def _configure(self, *, metric: str) -> None:
        self.metric = check_choice("metric", metric, METRICS)

    def settings(self) -> dict:
        return {"metric": self.metric}

    def _statistic_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {"sums": (k, self.in_features)}

    def _solution_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        return {"means": (k, self.in_features)}

    def _accumulate(self, pending: dict, x: torch.Tensor, onehot: torch.Tensor) -> None:
        pending["sums"] += onehot.T @ x

    def _solve(self) -> None:
        self.means = (self.sums / self.counts.clamp(min=1).unsqueeze(1)).contiguous()

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.metric == "cosine":
            return nn.functional.normalize(x, dim=1) @ nn.functional.normalize(self.means, dim=1).T
        # |x - mu|^2 = |x|^2 - 2 <x, mu> + |mu|^2, without a (B, K, d) difference tensor.
        means = self.means
        squared = x.square().sum(1, keepdim=True) - 2 * x @ means.T + means.square().sum(1)
        return -squared
