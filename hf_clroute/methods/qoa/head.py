"""Query-only attention (QOA): a learned relevance score over a support set.

For a query ``x_t`` and a support set ``S = {(x_j, y_j)}`` drawn from a replay
buffer, a network scores every support item, ``s_j = Q_theta(x_t, x_j, y_j)``,
and the prediction is the score-weighted sum of the support labels,
``y_hat = sum_j d_j y_j`` with ``d = softmax_j(s)`` (or ``s / |S|``, see
:class:`~.config.QoaConfig`). There are no keys and no values: the query is
compared with each stored item by the learned scorer alone, so the cost is
linear in ``|S|`` (full attention over the support set is quadratic).

:class:`QueryOnlyAttention` is the paper's scorer: ``Q_theta`` is an MLP over the
concatenation ``[x_t; x_j; y_j]``. Its first
layer ``W [x_t; x_j; y_j] = W_q x_t + W_x x_j + W_y y_j`` is evaluated per query
and per support item and added (exactly the same function, computed in
O((B + |S|) h) instead of O(B |S| h)); the deeper layers run on every
(query, item) pair: O(B |S| h^2).

:class:`SimilarityAttention` (the head's default) scores
``cos(x_t, x_j) / tau + r(x_t, x_j, y_j, cos)``: the cosine similarity the MLP
would otherwise have to learn is given to it, and the residual ``r`` (the same
kind of MLP, reading the cosine as a fourth input) starts at exactly zero, so
the untrained head is a cosine-similarity attention classifier.

:class:`QoaLearner` is the standalone learner on raw inputs that the plasticity
suites (``hf_clroute.bench_plasticity``) train; :class:`~.method.Qoa` is the
same scorer as a head on a backbone's pooled features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.core.replay_buffer import ReservoirBuffer
from hf_clroute.methods.qoa.config import QoaConfig

#: (query, support item) pairs scored at once; larger evaluations are chunked over queries.
PAIR_BUDGET = 1 << 18


def support_generator(seed: int, purpose: int, counter: int) -> torch.Generator:
    """A generator that is a pure function of (seed, purpose, counter): the same draw on
    every process and after a save/load, with no RNG state to carry."""
    return torch.Generator().manual_seed((seed * 1_000_003 + purpose) * 1_000_033 + counter)


def classification_log_probs(prediction: torch.Tensor, num_classes: int, probabilities: bool,
                             floor: float) -> torch.Tensor:
    """Log-probabilities over the first ``num_classes`` label slots.

    ``probabilities``: the prediction is already a convex combination of one-hot
    labels (softmax scores); it is mixed with the uniform distribution by ``floor``
    so a class absent from the support keeps a finite log-probability. Otherwise the
    prediction is read as logits.
    """
    prediction = prediction[:, :num_classes]
    if not probabilities:
        return F.log_softmax(prediction.float(), dim=-1)  # fp32 under any autocast: it feeds the loss
    return torch.log((1.0 - floor) * prediction + floor / num_classes)


class QueryOnlyAttention(nn.Module):
    """``forward(query, support_x, support_y) = sum_j d_j y_j`` with ``d_j`` from a learned scorer."""

    def __init__(self, input_dim: int, label_dim: int, hidden_size: int = 128, num_layers: int = 2,
                 normalization: str = "softmax") -> None:
        super().__init__()
        if normalization not in QoaConfig.NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {QoaConfig.NORMALIZATIONS}, got {normalization!r}")
        self.normalization = normalization
        # The three column blocks of the first layer of an MLP over [query; item; label].
        self.query_proj = nn.Linear(input_dim, hidden_size)
        self.item_proj = nn.Linear(input_dim, hidden_size, bias=False)
        self.label_proj = nn.Linear(label_dim, hidden_size, bias=False)
        layers: list[nn.Module] = [nn.ReLU()]
        for _ in range(num_layers - 1):
            layers += [nn.Linear(hidden_size, hidden_size), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.score = nn.Linear(hidden_size, 1)  # the "last layer" of the Hessian diagnostics

    @classmethod
    def from_config(cls, config: QoaConfig, input_dim: int) -> "QueryOnlyAttention":
        return cls(input_dim, config.label_dim, config.hidden_size, config.num_layers, config.score_normalization)

    @property
    def outputs_probabilities(self) -> bool:
        """Softmax weights over one-hot labels make the prediction a probability vector."""
        return self.normalization == "softmax"

    def scores(self, query: torch.Tensor, support_x: torch.Tensor, support_y: torch.Tensor) -> torch.Tensor:
        """(B, S) relevance scores s_j = Q_theta(x_t, x_j, y_j)."""
        item = self.item_proj(support_x) + self.label_proj(support_y)  # (S, h), once per item
        pairs = self.query_proj(query).unsqueeze(1) + item.unsqueeze(0)  # (B, S, h)
        return self.score(self.body(pairs)).squeeze(-1)

    def weights(self, scores: torch.Tensor) -> torch.Tensor:
        """d_j: softmax over the support set, or the raw scores averaged over it."""
        if self.normalization == "softmax":
            return scores.softmax(dim=-1)
        return scores / scores.shape[-1]

    def forward(self, query: torch.Tensor, support_x: torch.Tensor, support_y: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, label_dim): sum_j d_j y_j. Large (queries x support) products are chunked over queries.
        ``mask`` (B, S): pairs left out (weight 0), e.g. a replayed query's own buffer slot."""
        chunk = max(1, PAIR_BUDGET // max(1, support_x.shape[0]))
        outputs = []
        for start in range(0, len(query), chunk):
            scores = self.scores(query[start:start + chunk], support_x, support_y)
            if mask is None:
                weights = self.weights(scores)
            elif self.normalization == "softmax":
                weights = self.weights(scores.masked_fill(mask[start:start + chunk], float("-inf")))
            else:
                weights = self.weights(scores).masked_fill(mask[start:start + chunk], 0.0)
            outputs.append(weights @ support_y)
        return torch.cat(outputs)


class SimilarityAttention(nn.Module):
    """``sum_j softmax_j(cos(x_t, x_j) / tau + r(x_t, x_j, y_j, cos)) y_j`` with a zero-initialised residual ``r``.

    The residual reads unit-normalised features (the cosine's own scale-free view),
    the label and the cosine; its output layer starts at zero, so it contributes
    nothing until trained, and gradients reach its hidden layers once that layer
    has moved. ``mask`` (B, S) marks pairs excluded from the softmax (a query's own
    buffer slot when buffer items are queries).
    """

    outputs_probabilities = True  # softmax weights over one-hot labels

    def __init__(self, input_dim: int, label_dim: int, hidden_size: int = 128, num_layers: int = 2,
                 temperature: float = 0.03, learn_temperature: bool = True, learn_residual: bool = True,
                 residual_reads_label: bool = True) -> None:
        super().__init__()
        self.residual_reads_label = residual_reads_label
        log_temperature = torch.tensor(float(temperature)).log()
        if learn_temperature:
            self.log_temperature = nn.Parameter(log_temperature)
        else:
            self.register_buffer("log_temperature", log_temperature)
        self.residual = None
        if learn_residual:
            self.residual = QueryOnlyAttention(input_dim, label_dim, hidden_size, num_layers)
            self.similarity_proj = nn.Linear(1, hidden_size, bias=False)  # the cosine's column of the first layer
            nn.init.zeros_(self.residual.score.weight)
            nn.init.zeros_(self.residual.score.bias)
            if not residual_reads_label:
                self.residual.label_proj = None  # no parameter that never gets a gradient

    @classmethod
    def from_config(cls, config: QoaConfig, input_dim: int) -> "SimilarityAttention":
        return cls(input_dim, config.label_dim, config.hidden_size, config.num_layers, config.temperature,
                   config.learn_temperature, config.learn_residual, config.residual_reads_label)

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    def scores(self, query: torch.Tensor, support_x: torch.Tensor, support_y: torch.Tensor) -> torch.Tensor:
        """(B, S) scores: the cosine over the temperature, plus the residual."""
        query, support_x = F.normalize(query, dim=-1), F.normalize(support_x, dim=-1)
        cosine = query @ support_x.T
        scores = cosine / self.log_temperature.exp()
        if self.residual is None:
            return scores
        r = self.residual
        item = r.item_proj(support_x) + (r.label_proj(support_y) if self.residual_reads_label else 0.0)
        pairs = r.query_proj(query).unsqueeze(1) + item.unsqueeze(0) + self.similarity_proj(cosine.unsqueeze(-1))
        return scores + r.score(r.body(pairs)).squeeze(-1)

    def forward(self, query: torch.Tensor, support_x: torch.Tensor, support_y: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, label_dim) predictions, chunked over queries as :class:`QueryOnlyAttention`'s."""
        chunk = max(1, PAIR_BUDGET // max(1, support_x.shape[0]))
        outputs = []
        for start in range(0, len(query), chunk):
            scores = self.scores(query[start:start + chunk], support_x, support_y)
            if mask is not None:
                scores = scores.masked_fill(mask[start:start + chunk], float("-inf"))
            outputs.append(scores.softmax(dim=-1) @ support_y)
        return torch.cat(outputs)


def build_scorer(config: QoaConfig, input_dim: int) -> nn.Module:
    """The head's scorer named by ``config.scorer``."""
    if config.scorer == "similarity":
        return SimilarityAttention.from_config(config, input_dim)
    return QueryOnlyAttention.from_config(config, input_dim)


def class_balanced_indices(labels: torch.Tensor, per_class: int, generator: torch.Generator) -> torch.Tensor:
    """Up to ``per_class`` positions of every label value in ``labels``, drawn without replacement
    (all of a class that has fewer), in class order. A class's share of the support is then
    independent of how many of its items the reservoir happens to hold."""
    picks = []
    for c in labels.unique(sorted=True):
        positions = (labels == c).nonzero().squeeze(1)
        picks.append(positions[torch.randperm(len(positions), generator=generator)[:per_class].to(positions.device)])
    return torch.cat(picks) if picks else labels.new_zeros(0)


class QoaLearner(nn.Module):
    """A standalone continual learner: a support-set predictor over its own replay buffer(s).

    ``predictor(query, support_x, support_y)`` is :class:`QueryOnlyAttention` by
    default; the plasticity benchmark plugs full softmax attention in the same place
    so both see the same support sets. ``task_aware=True`` keeps one reservoir
    sub-buffer per task and draws a query's support from its own task's sub-buffer
    (the paper's setting when task identities are available, e.g. permuted MNIST,
    where items of other permutations carry no information about a query);
    otherwise one reservoir holds the whole stream. This is the paper's learner as
    the plasticity suites measure it: the MLP scorer and uniform ``support_size`` /
    ``eval_support_size`` draws; ``scorer``, ``support_per_class`` and
    ``replay_queries`` configure the head (:class:`~.method.Qoa`) only.
    """

    def __init__(self, config: QoaConfig, input_dim: int, predictor: nn.Module | None = None,
                 task_aware: bool = False) -> None:
        super().__init__()
        self.config = config
        self.task_aware = task_aware
        self.predictor = predictor if predictor is not None else QueryOnlyAttention.from_config(config, input_dim)
        self.memory = nn.ModuleDict()
        self.steps = 0

    # ---- memory -----------------------------------------------------------------------
    def _buffer(self, task: int) -> ReservoirBuffer:
        key = str(task) if self.task_aware else "all"
        if key not in self.memory:
            seed = self.config.seed * 100_003 + len(self.memory)
            self.memory[key] = ReservoirBuffer(self.config.buffer_size, seed=seed)
        return self.memory[key]

    def encode_labels(self, y: torch.Tensor) -> torch.Tensor:
        if self.config.task == "classification":
            return F.one_hot(y.long(), self.config.label_dim).float()
        return y.float().reshape(len(y), self.config.target_dim)

    def observe(self, x: torch.Tensor, y: torch.Tensor, task: int = 0) -> None:
        """Add a batch the learner has just trained on to the memory."""
        self._buffer(task).add({"x": x.detach().float(), "y": self.encode_labels(y)})

    def support(self, task: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``size`` items of the task's memory (all of it when ``size`` is 0); None when empty."""
        buffer = self._buffer(task)
        if len(buffer) == 0:
            return None
        items = buffer.sample(size, generator) if size else buffer.contents()
        return items["x"], items["y"]

    # ---- prediction -------------------------------------------------------------------
    def prepare(self, x: torch.Tensor, task: int = 0, train: bool = False):
        """(predictor args) for a query batch, or None when there is no support yet.

        Training resamples the support at every step; evaluation uses the whole memory
        (or ``eval_support_size`` items drawn with a generator fixed by the step count).
        """
        size = self.config.support_size if train else self.config.eval_support_size
        generator = support_generator(self.config.seed, int(train), self.steps)
        support = self.support(task, size, generator)
        return None if support is None else (x.float(), *support)

    def output(self, prediction: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (classification) or the regression output."""
        if self.config.task == "regression":
            return prediction
        probabilities = getattr(self.predictor, "outputs_probabilities", False)
        return classification_log_probs(prediction, self.config.max_classes, probabilities,
                                        self.config.probability_floor)

    def objective(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.config.task == "regression":
            return F.mse_loss(output, self.encode_labels(y))
        return F.nll_loss(output, y.long())

    def forward(self, x: torch.Tensor, task: int = 0) -> torch.Tensor:
        args = self.prepare(x, task)
        if args is None:  # nothing stored yet: a uniform (or zero) prediction
            dim = self.config.max_classes if self.config.task == "classification" else self.config.target_dim
            fill = -torch.log(torch.tensor(float(dim))) if self.config.task == "classification" else 0.0
            return x.new_full((len(x), dim), float(fill))
        return self.output(self.predictor(*args))

    def training_loss(self, x: torch.Tensor, y: torch.Tensor, task: int = 0) -> torch.Tensor | None:
        """Loss on a batch against a freshly drawn support set (None: no support yet)."""
        self.steps += 1
        args = self.prepare(x, task, train=True)
        return None if args is None else self.objective(self.output(self.predictor(*args)), y)
