"""Shallow vs deep forgetting: is old knowledge lost in the features, or misread by the head?

Shallow forgetting of task j is the drop of the model's own accuracy,
A_jj - A_Tj. Deep forgetting is the same drop for a linear probe fitted on the
model's features of task j's training data (A*_jj - A*_Tj): if the probe still
separates task j's classes after later tasks, the features kept the knowledge
and only the head lost it (arXiv:2512.07400). The probe is closed-form ridge
regression on standardised features with one-hot targets over task j's classes
— deterministic, no learning rate to tune, and well converged by construction.
The paper's feature separability SNR is reported beside it.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable

import torch
from torch.utils.data import DataLoader

from ..data.streams import Experience
from ..engine import Callback
from ..outputs import model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import ContinualTrainer

PROBE_RIDGE = 1e-2


@torch.no_grad()
def model_features(model, dataset, collator: Callable, limit: int | None = None, batch_size: int = 256):
    """(features, labels) of ``dataset`` as the method sees them (its adapted features)."""
    if limit is not None and len(dataset) > limit:
        dataset = dataset.select(range(limit))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    feats, labels = [], []
    for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
        inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
        feats.append(model.method.features(model, inputs).float().cpu())
        labels.append(batch["labels"])
    model.train(was_training)
    return torch.cat(feats), torch.cat(labels)


def fit_probe(x: torch.Tensor, y: torch.Tensor, ridge: float = PROBE_RIDGE):
    """Closed-form ridge probe: returns ``predict(x) -> labels``."""
    classes = torch.unique(y)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = torch.cat([(x - mean) / std, torch.ones(len(x), 1)], dim=1).double()
    targets = (y.unsqueeze(1) == classes.unsqueeze(0)).double()
    gram = z.T @ z + ridge * len(x) * torch.eye(z.shape[1], dtype=torch.float64)
    weights = torch.linalg.solve(gram, z.T @ targets)

    def predict(x_new: torch.Tensor) -> torch.Tensor:
        z_new = torch.cat([(x_new - mean) / std, torch.ones(len(x_new), 1)], dim=1).double()
        return classes[(z_new @ weights).argmax(dim=1)]

    return predict


def feature_snr(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean over class pairs of ||mu_a - mu_b||^2 / (var_a + var_b), var = mean squared
    distance to the class mean: how far apart classes sit relative to their spread."""
    stats = {}
    for c in torch.unique(y).tolist():
        xc = x[y == c].double()
        mu = xc.mean(0)
        stats[c] = (mu, ((xc - mu) ** 2).sum(1).mean())
    ratios = [
        float(((stats[a][0] - stats[b][0]) ** 2).sum() / (stats[a][1] + stats[b][1]).clamp_min(1e-12))
        for a, b in itertools.combinations(stats, 2)
    ]
    return sum(ratios) / len(ratios) if ratios else 0.0


def probe_task(model, experience: Experience, collator: Callable, train_limit: int = 300) -> dict[str, float]:
    """Linear-probe accuracy and SNR of the model's current features on one task."""
    x_train, y_train = model_features(model, experience.train, collator, limit=train_limit)
    x_test, y_test = model_features(model, experience.test, collator)
    predict = fit_probe(x_train, y_train)
    accuracy = (predict(x_test) == y_test).double().mean().item()
    return {"probe_accuracy": accuracy, "snr": feature_snr(x_test, y_test)}


def forgetting_split(accuracy_matrix, probe_diag, probe_final) -> dict[str, object]:
    """Per-task and mean shallow (own head) and deep (linear probe) forgetting over tasks j < T."""
    T = len(accuracy_matrix)
    shallow = [accuracy_matrix[j][j] - accuracy_matrix[T - 1][j] for j in range(T - 1)]
    deep = [probe_diag[j] - probe_final[j] for j in range(T - 1)]
    mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
    return {"shallow_per_task": shallow, "deep_per_task": deep, "shallow": mean(shallow), "deep": mean(deep)}


class ForgettingProbes(Callback):
    """Engine callback: probe task j right after it (``diag``) and every task after the last (``final``)."""

    name = "probes"

    def on_task_end(self, trainer: "ContinualTrainer", task_id: int) -> None:
        records = self.records(trainer)
        records.setdefault("diag", []).append(probe_task(trainer.model, trainer.stream[task_id], trainer.collator))
        if task_id == len(trainer.stream) - 1:
            records["final"] = [probe_task(trainer.model, e, trainer.collator) for e in trainer.stream]
