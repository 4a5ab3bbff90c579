"""Linear probes on feature tensors: what a model's features still tell apart, read with torch alone.

The probe is multinomial logistic regression on standardised features, run to convergence
(full-batch L-BFGS: no learning rate). The deep-forgetting probe (:func:`fit_probe`) chooses its L2
penalty on a held-out fifth of its training examples (never on test data), then is refitted on all
of them. It is at least as strong a reader of the features as the statistics heads, so a drop in
its accuracy is a loss in the features, not a weak probe's. :func:`feature_snr` is the paper's
feature separability SNR, reported beside it. The engine side (features read from a model, the
per-task callback) is :mod:`hf_clroute.bench.harness.probes`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from typing import Callable

import torch

#: the probe's name, recorded in every probed results row (``probe``): deep forgetting measured by
#: different probes is never compared (``report.above_floor``)
PROBE_NAME = "logistic"
#: the probe's L2 penalties, one chosen on a held-out fifth of its training examples
PROBE_WEIGHT_DECAYS = (1e-6, 1e-5, 1e-4)
#: share of the probe's training examples held out to choose its L2 penalty
PROBE_HOLDOUT = 0.2
#: L-BFGS iterations of the linear probes that read a whole backbone (the headroom readout, the pretrained
#: backbones' reports): more classes and examples at once than a deep-forgetting probe
PROBE_MAX_ITER = 500


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
    key = hashlib.sha256(x.detach().float().contiguous().cpu().numpy().tobytes() + y.detach().cpu().numpy().tobytes()
                         + repr((tuple(weight_decays), holdout)).encode()).hexdigest()
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


def forgetting_split(accuracy_matrix, probe_diag, probe_final) -> dict[str, object]:
    """Per-task and mean forgetting over tasks j < T of the head (A_jj - A_Tj) and of the probe (deep)."""
    T = len(accuracy_matrix)
    head = [accuracy_matrix[j][j] - accuracy_matrix[T - 1][j] for j in range(T - 1)]
    deep = [probe_diag[j] - probe_final[j] for j in range(T - 1)]
    mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
    return {"head_per_task": head, "deep_per_task": deep, "head": mean(head), "deep": mean(deep)}
