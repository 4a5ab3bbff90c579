"""Cosine k-nearest neighbours over a reservoir buffer of frozen features.

The control for QOA: the same memory (a :class:`~hf_clroute.core.replay_buffer.ReservoirBuffer`
of (features, label) with QOA's capacity and seed, filled with the same global
batches in the same order, so on the same stream it holds the same items), read by
a fixed rule instead of a learned scorer. Nothing is trained.

Prediction for a query: the ``k`` stored items with the highest cosine similarity
vote for their labels; the class with the most votes wins, and among classes with
equally many votes the one whose voters have the larger summed similarity. The
logits encode exactly that order: ``votes_c + simsum_c / (2k + 1)``. (``simsum_c``
lies in ``[-votes_c, votes_c]``, so one more vote always outweighs any similarity
difference: with ``v + 1 <= k`` the score gap is at least ``1 - (2v + 1)/(2k + 1) > 0``.)
Classes with no vote score below every voted class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hf_clroute.baselines.knn.config import KNNConfig
from hf_clroute.core.method import FeatureMemoryMethod

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

#: (query, stored item) similarities computed at once; larger evaluations are chunked over queries.
PAIR_BUDGET = 1 << 22


def knn_logits(
    query: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, k: int, num_classes: int
) -> torch.Tensor:
    """(B, num_classes) scores ``votes_c + simsum_c / (2k + 1)`` of the ``k`` most cosine-similar
    ``keys`` (N, d) with integer ``labels`` (N,); see the module docstring."""
    k = min(k, keys.shape[0])
    keys = F.normalize(keys.float(), dim=1)
    chunk = max(1, PAIR_BUDGET // max(1, keys.shape[0]))
    rows = []
    for q in query.split(chunk):
        top, index = (F.normalize(q.float(), dim=1) @ keys.T).topk(k, dim=1)
        voters = labels[index]
        votes = top.new_zeros(len(q), num_classes).scatter_add_(1, voters, torch.ones_like(top))
        similarity = top.new_zeros(len(q), num_classes).scatter_add_(1, voters, top)
        rows.append(votes + similarity / (2 * k + 1))
    return torch.cat(rows) if rows else query.new_zeros(0, num_classes, dtype=torch.float32)


class KNearestNeighbours(FeatureMemoryMethod):
    """Cosine k-NN (majority vote, similarity-weighted ties) over a reservoir buffer of frozen features."""

    config_class = KNNConfig

    def classify(self, model: "CLModel", features: torch.Tensor) -> torch.Tensor:
        if len(self.buffer) == 0:
            return features.new_zeros(len(features), self.num_classes)
        items = self.buffer.contents()
        keys, labels = items["features"].to(features.device), items["labels"].to(features.device)
        return knn_logits(features, keys, labels, self.config.k, self.num_classes).to(features.dtype)
