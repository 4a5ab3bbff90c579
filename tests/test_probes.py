"""The deep-forgetting probe works in the head's label space, on the method's own features."""

from __future__ import annotations

import torch
from datasets import Dataset
from torch import nn

from hf_clroute.bench.feature_cache import FeatureCollator
from hf_clroute.bench.probes import forgetting_split, probe_seen_tasks
from hf_clroute.data.streams import Experience
from hf_clroute.outputs import CLModelOutput


class Passthrough(nn.Module):
    """A 'model' whose classifier reads the batch's features as given (doubled, to tell them apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, features: torch.Tensor, **_) -> CLModelOutput:
        return CLModelOutput(features=2 * features)


def cluster(center: list[float], n: int, seed: int) -> list[list[float]]:
    g = torch.Generator().manual_seed(seed)
    return (torch.tensor(center) + 0.05 * torch.randn(n, len(center), generator=g)).tolist()


def experience(task_id: int, classes: list[int], train_centers: dict, test_centers: dict) -> Experience:
    def split(centers, seed):
        rows = [(x, c) for c, center in centers.items() for x in cluster(center, 20, seed + c)]
        return Dataset.from_dict({"features": [x for x, _ in rows], "label": [c for _, c in rows]})
    return Experience(task_id, f"t{task_id}", classes, split(train_centers, 0), split(test_centers, 100))


def test_probe_covers_every_seen_class_not_only_the_task_pair():
    centers = {0: [1.0, 0.0], 1: [0.0, 1.0], 2: [-1.0, 0.0], 3: [0.0, -1.0]}
    first = experience(0, [0, 1], {0: centers[0], 1: centers[1]}, {0: centers[0], 1: centers[1]})
    # Task 1's test images look exactly like task 0's classes: a binary probe over {2, 3} would still
    # separate them perfectly, a probe over all four seen classes calls them 0 and 1.
    second = experience(1, [2, 3], {2: centers[2], 3: centers[3]}, {2: centers[0], 3: centers[1]})
    scores = probe_seen_tasks(Passthrough(), [first, second], FeatureCollator())
    assert scores[0]["probe_accuracy"] == 1.0
    assert scores[1]["probe_accuracy"] == 0.0


def test_forgetting_split_is_the_drop_of_head_and_probe():
    split = forgetting_split([[0.9, 0.0], [0.4, 0.8]], probe_diag=[0.95, 0.9], probe_final=[0.85, 0.9])
    assert split["head"] == 0.9 - 0.4 and abs(split["deep"] - 0.1) < 1e-12
