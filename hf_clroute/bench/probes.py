"""Deep forgetting: is old knowledge lost in the features, or only misread by the head?

After task t, a linear probe is fitted on the model's own features (what its
classifier reads: ``CLModelOutput.features``, so MaRS's memory output h~ rather
than the frozen backbone's h) of the training data of every task seen so far,
over all classes seen so far: the head's own label space. Its accuracy on task
j's test split is A*_tj. Deep forgetting of task j is A*_jj - A*_Tj, the probe's
counterpart of the head's forgetting A_jj - A_Tj (arXiv:2512.07400): when the
head forgets and the probe does not, the features kept the knowledge and only
the head lost it. The probe is closed-form ridge regression on standardised
features with one-hot targets: deterministic, no learning rate to tune. The
paper's feature separability SNR is reported beside it.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable

import torch
from torch.utils.data import DataLoader

from ..engine import Callback
from ..outputs import model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import ContinualTrainer

PROBE_RIDGE = 1e-2
#: training examples per task the probe is fitted on (the features are recomputed at every task end).
PROBE_TRAIN_PER_TASK = 300
#: batch size of the probe's forward passes
PROBE_BATCH_SIZE = 256


@torch.no_grad()
def model_features(model, dataset, collator: Callable, limit: int | None = None, batch_size: int = PROBE_BATCH_SIZE):
    """(features, labels) of ``dataset`` as the model's classifier reads them, in eval mode (no dropout)
    whatever mode the model was in; its mode is restored afterwards."""
    if limit is not None and len(dataset) > limit:
        dataset = dataset.select(range(limit))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    feats, labels = [], []
    try:
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
            out = model(**{k: v.to(device) for k, v in model_inputs(batch).items()})
            feats.append(out.features.float().cpu())
            labels.append(batch["labels"])
    finally:
        model.train(was_training)
    return torch.cat(feats), torch.cat(labels)


def fit_probe(x: torch.Tensor, y: torch.Tensor, ridge: float = PROBE_RIDGE):
    """Closed-form ridge probe over the classes in ``y``: returns ``predict(x) -> labels``."""
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


def probe_seen_tasks(model, experiences: list, collator: Callable, train_per_task: int = PROBE_TRAIN_PER_TASK,
                     test_features: Callable[[int], tuple | None] | None = None) -> list[dict[str, float]]:
    """One probe over every class of ``experiences`` (the tasks seen so far), scored on each one's test split.

    ``test_features(j)`` may give task j's test (features, labels) as computed already (by the
    evaluation just run, in batches of :data:`PROBE_BATCH_SIZE`: the same numbers), else None.
    """
    train = [model_features(model, e.train, collator, limit=train_per_task) for e in experiences]
    predict = fit_probe(torch.cat([x for x, _ in train]), torch.cat([y for _, y in train]))
    scores = []
    for j, experience in enumerate(experiences):
        kept = test_features(j) if test_features is not None else None
        x_test, y_test = kept if kept is not None else model_features(model, experience.test, collator)
        accuracy = (predict(x_test) == y_test).double().mean().item()
        scores.append({"probe_accuracy": accuracy, "snr": feature_snr(x_test, y_test)})
    return scores


def forgetting_split(accuracy_matrix, probe_diag, probe_final) -> dict[str, object]:
    """Per-task and mean forgetting over tasks j < T of the head (A_jj - A_Tj) and of the probe (deep)."""
    T = len(accuracy_matrix)
    head = [accuracy_matrix[j][j] - accuracy_matrix[T - 1][j] for j in range(T - 1)]
    deep = [probe_diag[j] - probe_final[j] for j in range(T - 1)]
    mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
    return {"head_per_task": head, "deep_per_task": deep, "head": mean(head), "deep": mean(deep)}


class ForgettingProbes(Callback):
    """Engine callback: after task t, the probe over tasks 0..t scores task t (``diag``: A*_tt);
    after the last task it scores every task (``final``: A*_Tj)."""

    name = "probes"

    def on_task_end(self, trainer: "ContinualTrainer", task_id: int) -> None:
        records = self.records(trainer)
        # The boundary row just scored these test splits; its features are the probe's when its
        # batches were the probe's.
        same_batches = trainer.config.eval_batch_size == PROBE_BATCH_SIZE
        scores = probe_seen_tasks(trainer.model, trainer.stream[: task_id + 1], trainer.collator,
                                  test_features=trainer.test_features if same_batches else None)
        records.setdefault("diag", []).append(scores[task_id])
        if task_id == len(trainer.stream) - 1:
            records["final"] = scores
