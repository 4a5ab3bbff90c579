"""Deep forgetting: is old knowledge lost in the features, or only misread by the head?

After task t, a linear probe (:func:`~hf_clroute.metrics.probes.fit_probe`) is fitted on the
model's own features (what its classifier reads: ``CLModelOutput.features``, so MaRS's memory
output h~ rather than the frozen backbone's h) of the training data of every task seen so far,
over all classes seen so far: the head's own label space. Its accuracy on task j's test split is
A*_tj. Deep forgetting of task j is A*_jj - A*_Tj, the probe's counterpart of the head's
forgetting A_jj - A_Tj (arXiv:2512.07400): when the head forgets and the probe does not, the
features kept the knowledge and only the head lost it. The probe is fitted on every training
example of the seen tasks; the paper's feature separability SNR is reported beside it.

A frozen backbone's features cannot change, yet its probe still "forgets": the
label space grows, and old classes get new neighbours. That floor is the
deep forgetting of a statistics head on the same stream (see
``report.deep_forgetting_floor``); a method's deep forgetting above it is what its
own training cost the features.

The probe itself reads tensors only and lives in :mod:`hf_clroute.metrics.probes`; its names are
importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch.utils.data import DataLoader

from hf_clroute.core.outputs import model_inputs
from hf_clroute.engine import Callback
from hf_clroute.metrics.probes import (
    PROBE_HOLDOUT,
    PROBE_MAX_ITER,
    PROBE_NAME,
    PROBE_WEIGHT_DECAYS,
    feature_snr,
    fit_logistic,
    fit_probe,
    forgetting_split,
    linear_probe_accuracy,
)

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.engine import ContinualTrainer

__all__ = [
    "PROBE_BATCH_SIZE",
    "PROBE_HOLDOUT",
    "PROBE_MAX_ITER",
    "PROBE_NAME",
    "PROBE_TRAIN_PER_TASK",
    "PROBE_WEIGHT_DECAYS",
    "ForgettingProbes",
    "feature_snr",
    "fit_logistic",
    "fit_probe",
    "forgetting_split",
    "linear_probe_accuracy",
    "model_features",
    "probe_seen_tasks",
]

#: training examples per task the probe is fitted on (None: all; the features are recomputed at every task end).
PROBE_TRAIN_PER_TASK = None
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


def probe_seen_tasks(model, experiences: list, collator: Callable, train_per_task: int | None = PROBE_TRAIN_PER_TASK,
                     test_features: Callable[[int], tuple | None] | None = None,
                     kept: dict[tuple[str, int], tuple] | None = None) -> list[dict[str, float]]:
    """One probe over every class of ``experiences`` (the tasks seen so far), scored on each one's test split.

    ``test_features(j)`` may give task j's test (features, labels) as computed already (by the
    evaluation just run, in batches of :data:`PROBE_BATCH_SIZE`: the same numbers), else None.
    ``kept``, when given, holds (features, labels) by (split, j): read where present, filled where
    not (the caller keeps it only while the features cannot change).
    """
    def features(split: str, j: int, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if kept is not None and (split, j) in kept:
            return kept[split, j]
        computed = (test_features(j) if split == "test" and test_features is not None else None) \
            or model_features(model, getattr(experiences[j], split), collator, limit=limit)
        if kept is not None:
            kept[split, j] = computed
        return computed

    train = [features("train", j, train_per_task) for j in range(len(experiences))]
    predict = fit_probe(torch.cat([x for x, _ in train]), torch.cat([y for _, y in train]))
    scores = []
    for j in range(len(experiences)):
        x_test, y_test = features("test", j)
        accuracy = (predict(x_test) == y_test).double().mean().item()
        scores.append({"probe_accuracy": accuracy, "snr": feature_snr(x_test, y_test)})
    return scores


class ForgettingProbes(Callback):
    """Engine callback: after task t, the probe over tasks 0..t scores task t (``diag``: A*_tt);
    after the last task it scores every task (``final``: A*_Tj)."""

    name = "probes"

    def __init__(self, keep_features: bool = True) -> None:
        # Task j's training and test features, kept while the model reads fixed features
        # (``CLModel.reads_fixed_features``: a frozen backbone, or a LoRA frozen after first-session
        # adaptation): then every later task end reads them instead of running the backbone over
        # task j's splits again (t + 1 passes at task t: 36 passes over a task's training split on
        # wordnet's 8 tasks, against the 8 that train). Any task end whose features can change
        # empties them.
        self.keep_features = keep_features
        self._kept: dict[tuple[str, int], tuple] = {}
        self._owner: tuple[int, torch.Tensor] | None = None

    def on_task_end(self, trainer: "ContinualTrainer", task_id: int) -> None:
        records = self.records(trainer)
        # The boundary row just scored these test splits; its features are the probe's when its
        # batches were the probe's.
        same_batches = trainer.config.eval_batch_size == PROBE_BATCH_SIZE
        fixed = self.keep_features and trainer.model.reads_fixed_features()
        # kept features stand only for the run and backbone weights they were computed with (a
        # method could unfreeze the backbone within a task and freeze it again by its end)
        owner = (id(trainer), trainer.model.features_fingerprint()) if fixed else None
        kept = self._owner
        if owner is None or kept is None or owner[0] != kept[0] or not torch.equal(owner[1], kept[1]):
            self._kept, self._owner = {}, owner
        scores = probe_seen_tasks(trainer.model, trainer.stream[: task_id + 1], trainer.collator,
                                  test_features=trainer.test_features if same_batches else None,
                                  kept=self._kept if fixed else None)
        records.setdefault("diag", []).append(scores[task_id])
        if task_id == len(trainer.stream) - 1:
            records["final"] = scores
