"""Deep forgetting: is old knowledge lost in the features, or only misread by the head?

After task t, a linear probe is fitted on the model's own features (what its
classifier reads: ``CLModelOutput.features``, so MaRS's memory output h~ rather
than the frozen backbone's h) of the training data of every task seen so far,
over all classes seen so far: the head's own label space. Its accuracy on task
j's test split is A*_tj. Deep forgetting of task j is A*_jj - A*_Tj, the probe's
counterpart of the head's forgetting A_jj - A_Tj (arXiv:2512.07400): when the
head forgets and the probe does not, the features kept the knowledge and only
the head lost it. The probe is multinomial logistic regression on standardised
features, run to convergence (full-batch L-BFGS: no learning rate), fitted on every
training example of the seen tasks; its L2 penalty is chosen on a held-out fifth of
those examples (never on test data), then it is refitted on all of them. It is at
least as strong a reader of the features as the statistics heads, so a drop in its
accuracy is a loss in the features, not a weak probe's. The paper's feature
separability SNR is reported beside it.

A frozen backbone's features cannot change, yet its probe still "forgets": the
label space grows, and old classes get new neighbours. That floor is the
deep forgetting of a statistics head on the same stream (see
``report.deep_forgetting_floor``); a method's deep forgetting above it is what its
own training cost the features.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

import torch
from torch.utils.data import DataLoader

from hf_clroute.core.outputs import model_inputs
from hf_clroute.engine import Callback

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.engine import ContinualTrainer

#: the probe's name, recorded in every probed results row (``probe``): deep forgetting measured by
#: different probes is never compared (``report.above_floor``)
PROBE_NAME = "logistic"
#: the probe's L2 penalties, one chosen on a held-out fifth of its training examples
PROBE_WEIGHT_DECAYS = (1e-6, 1e-5, 1e-4)
#: share of the probe's training examples held out to choose its L2 penalty
PROBE_HOLDOUT = 0.2
#: training examples per task the probe is fitted on (None: all; the features are recomputed at every task end).
PROBE_TRAIN_PER_TASK = None
#: batch size of the probe's forward passes
PROBE_BATCH_SIZE = 256
#: L-BFGS iterations of the linear probes that read a whole backbone (the headroom readout, the pretrained
#: backbones' reports): more classes and examples at once than a deep-forgetting probe
PROBE_MAX_ITER = 500


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


def fit_logistic(x: torch.Tensor, y: torch.Tensor, weight_decay: float, max_iter: int = 200):
    """Multinomial logistic regression over the classes in ``y`` on standardised features (mean/std of
    ``x``), full-batch L-BFGS with a strong-Wolfe line search run to convergence: deterministic, no
    learning rate. The L2 penalty keeps the optimum finite when classes are separable.
    Returns ``predict(x) -> labels``."""
    classes, targets = torch.unique(y, return_inverse=True)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = ((x - mean) / std).double()
    w = torch.zeros(z.shape[1], len(classes), dtype=torch.float64, requires_grad=True)
    b = torch.zeros(len(classes), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-7, tolerance_change=1e-10,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ w + b, targets) + weight_decay * w.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    w, b = w.detach(), b.detach()

    def predict(x_new: torch.Tensor) -> torch.Tensor:
        return classes[(((x_new - mean) / std).double() @ w + b).argmax(dim=1)]

    return predict


def linear_probe_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor,
                          test_y: torch.Tensor, weight_decay: float = 1e-4, max_iter: int = PROBE_MAX_ITER) -> float:
    """Test accuracy of multinomial logistic regression on standardised features, run to convergence
    (:func:`fit_logistic`; mean/std from the training features only)."""
    predict = fit_logistic(train_x, train_y, weight_decay, max_iter=max_iter)
    return (predict(test_x) == test_y).float().mean().item()


#: probes already fitted in this process, by the content of their training data (see :func:`fit_probe`)
_FITTED: OrderedDict[str, Callable] = OrderedDict()
_FITTED_SIZE = 16


def fit_probe(x: torch.Tensor, y: torch.Tensor, weight_decays=PROBE_WEIGHT_DECAYS, holdout: float = PROBE_HOLDOUT):
    """The deep-forgetting probe: :func:`fit_logistic` with the L2 penalty that scores best on a held-out
    share of (x, y) (a fixed permutation, so the choice is deterministic), refitted on all of (x, y).
    Returns ``predict(x) -> labels``.

    The fit is deterministic, so a probe on the very same data is fitted once per process: every method
    that classifies from the frozen backbone's features (the statistics heads, the head-only controls)
    probes identical features on a seed, and the L-BFGS fits were nearly all of their bench time."""
    key = hashlib.sha256(x.detach().float().contiguous().cpu().numpy().tobytes()
                         + y.detach().cpu().numpy().tobytes() + repr((tuple(weight_decays), holdout)).encode()).hexdigest()
    if key in _FITTED:
        _FITTED.move_to_end(key)
        return _FITTED[key]
    predict = _fit_probe(x, y, weight_decays, holdout)
    _FITTED[key] = predict
    if len(_FITTED) > _FITTED_SIZE:
        _FITTED.popitem(last=False)
    return predict


def _fit_probe(x: torch.Tensor, y: torch.Tensor, weight_decays, holdout: float):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = int(len(x) * holdout)
    if len(weight_decays) > 1 and cut > 0:
        held, kept = order[:cut], order[cut:]
        scores = [(fit_logistic(x[kept], y[kept], wd)(x[held]) == y[held]).double().mean().item()
                  for wd in weight_decays]
        weight_decay = weight_decays[max(range(len(scores)), key=scores.__getitem__)]  # first best: the smaller L2
    else:
        weight_decay = weight_decays[0]
    predict = fit_logistic(x, y, weight_decay)
    predict.weight_decay = weight_decay  # the chosen L2, for records and checks
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
