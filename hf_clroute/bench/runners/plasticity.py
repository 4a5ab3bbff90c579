"""Plasticity suites: permuted MNIST at 7x7 and slowly changing regression.

``hf-clroute bench --suite permuted-mnist`` (or ``drifting-regression``) runs,
over the same stream and seeds, four online learners on raw inputs:

* ``qoa``: :class:`~hf_clroute.methods.qoa.QoaLearner` (query-only attention over a replay buffer);
* ``full_attention``: the same learner and support sets with full softmax self-attention
  (a small transformer encoder over [support items; query]) in place of the scorer;
* ``backprop``: an MLP trained online with backpropagation;
* ``cbp``: the same MLP with continual backprop (Dohare et al. 2024): every step each hidden
  unit's contribution utility |h_i| * sum_k |w_ki| is tracked (running average), and a
  ``replacement_rate`` share of mature units with the lowest utility is re-initialised
  (fresh input weights, zero output weights, zeroed Adam moments);
* ``backprop-memory`` / ``cbp-memory``: the same two MLPs given what QOA is given: the task
  identities (one output head per task wherever QOA draws its support from a per-task
  sub-buffer, i.e. permuted MNIST) and the same memory (the reservoir buffers of a
  :class:`QoaLearner` with QOA's config and seed, so on the same stream they hold the same
  items), replayed each step: ``support_size`` items of one stored task, drawn uniformly.

A suite's ``method_settings`` names further rows, each one of these learners with some of the
suite's blocks overridden, e.g. ``"qoa-s1000": {"method": "qoa", "qoa": {"support_size": 1000}}``:
the same stream and seeds, so a variant is paired with every other row seed by seed.

Plasticity diagnostics, per task: accuracy (MSE for regression) on the newest task's test
split after training on it (plasticity), accuracy on a spread of earlier tasks every few
tasks (forgetting), and the effective rank of the loss Hessian w.r.t. the *last layer's*
parameters (as in the paper; the exact Hessian via ``torch.func.hessian``) on the task's
last training examples, ``erank = exp(H(p))`` with ``p_i = |lambda_i| / sum |lambda|``
(Roy & Vetterli 2007). The last layers differ in size (QOA's scorer output: hidden + 1
parameters; an MLP head: (hidden + 1) x classes), and the rank is bounded by it, so the
results also give ``erank / parameters`` of that set (``erank_*_normalised``). The cost of QOA and of full attention is counted in FLOPs
(``torch.utils.flop_counter``) for growing support sizes and fitted: QOA's is linear in
|S|, full attention's quadratic.

The slowly changing regression is Dohare et al.'s bit-flipping problem, the one the QOA
paper and continual backprop use: inputs are ``n_bits`` bits, the first ``n_flipping`` of
which stay fixed within a task and one of them flips at every task boundary, the rest are
random per example; the target is a fixed random network of linear threshold units (scaled
by 1/sqrt(width)). The function never changes; the input distribution drifts slowly.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, hessian

from hf_clroute.bench.harness.flops import count_flops
from hf_clroute.bench.harness.results import write_run
from hf_clroute.bench.harness.suites import load_suite, merge_seed_runs
from hf_clroute.methods.qoa import QoaConfig, QoaLearner, QueryOnlyAttention
from hf_clroute.metrics import format_mean_std, mean_std

ALL_METHODS = ("qoa", "full_attention", "backprop", "cbp", "backprop-memory", "cbp-memory")
#: the suite blocks a named variant (``method_settings``) may override, key by key
VARIANT_BLOCKS = ("qoa", "mlp", "attention")


@dataclass
class PlasticitySuite:
    """A plasticity suite file (``hf_clroute/configs/suites/<name>.json``)."""

    name: str
    kind: str  # "permuted-mnist" or "drifting-regression"
    runner: str = "plasticity"
    description: str = ""
    n_tasks: int = 200
    train_per_task: int = 300
    test_per_task: int = 100
    batch_size: int = 10
    image_size: int = 7
    n_bits: int = 20
    n_flipping: int = 15
    target_hidden: int = 100
    old_eval_every: int = 10
    old_tasks: int = 10
    hessian_every: int = 10
    hessian_examples: int = 50
    window: int = 20
    learning_rate: float = 1e-3
    mlp: dict[str, Any] = field(default_factory=dict)
    qoa: dict[str, Any] = field(default_factory=dict)
    attention: dict[str, Any] = field(default_factory=dict)
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    #: named rows: {"name": {"method": one of ALL_METHODS, "description": ..., "qoa"/"mlp"/"attention": overrides}}
    method_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, entry in self.method_settings.items():
            where = f"suite {self.name!r}: method_settings[{name!r}]"
            if name in ALL_METHODS:
                raise ValueError(f"{where} reuses a built-in method's name; give the variant its own")
            if not isinstance(entry, dict) or entry.get("method") not in ALL_METHODS:
                raise ValueError(f"{where} needs \"method\": one of {list(ALL_METHODS)}")
            unknown = sorted(set(entry) - {"method", "description", *VARIANT_BLOCKS})
            if unknown:
                raise ValueError(f"{where} has unknown key(s) {unknown}; known: method, description, "
                                 f"{', '.join(VARIANT_BLOCKS)}")
            bad = [k for k in VARIANT_BLOCKS if not isinstance(entry.get(k, {}), dict)]
            if bad:
                raise ValueError(f"{where}: {bad[0]} must be an object of overrides")

    @property
    def regression(self) -> bool:
        return self.kind == "drifting-regression"

    @property
    def known_methods(self) -> list[str]:
        return [*ALL_METHODS, *self.method_settings]

    def for_method(self, method: str) -> tuple[str, "PlasticitySuite"]:
        """(the learner ``method`` runs, this suite with the method's overrides applied)."""
        entry = self.method_settings.get(method)
        if entry is None:
            return method, self
        overrides = {k: {**getattr(self, k), **entry[k]} for k in VARIANT_BLOCKS if k in entry}
        return entry["method"], dataclasses.replace(self, **overrides)


@dataclass
class Task:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


# ---------------------------------------------------------------------------- streams


def permuted_mnist_tasks(suite: PlasticitySuite, seed: int) -> list[Task]:
    from hf_clroute.data import load_source, permuted

    stream = permuted(load_source("mnist"), n_tasks=suite.n_tasks, seed=seed, image_size=suite.image_size,
                      train_per_task=suite.train_per_task, test_per_task=suite.test_per_task, name="mnist")

    def tensors(ds):
        arrays = ds.with_format("numpy")[:]
        x = torch.from_numpy(np.asarray(arrays["image"], dtype=np.float32)).flatten(1) / 255.0
        return x, torch.from_numpy(np.asarray(arrays["label"], dtype=np.int64))

    return [Task(*tensors(e.train), *tensors(e.test)) for e in stream]


def drifting_regression_tasks(suite: PlasticitySuite, seed: int) -> list[Task]:
    g = torch.Generator().manual_seed(seed)
    m, f, width = suite.n_bits, suite.n_flipping, suite.target_hidden
    # Target network of linear threshold units (Dohare et al.): +-1 weights, thresholds
    # theta_i = (m + 1) * 0.7 - (number of negative input weights of unit i); +1 bias input.
    w_in = torch.randint(0, 2, (width, m + 1), generator=g).float() * 2 - 1
    theta = (m + 1) * 0.7 - (w_in < 0).sum(1).float()
    w_out = torch.randint(0, 2, (width,), generator=g).float() * 2 - 1

    def sample(flipping: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        rand = torch.randint(0, 2, (n, m - f), generator=g).float()
        x = torch.cat([flipping.expand(n, f), rand], dim=1)
        hidden = ((torch.cat([x, torch.ones(n, 1)], 1) @ w_in.T) > theta).float()
        return x, (hidden @ w_out / math.sqrt(width)).unsqueeze(1)

    flipping = torch.randint(0, 2, (f,), generator=g).float()
    tasks = []
    for t in range(suite.n_tasks):
        if t:
            flipping = flipping.clone()
            bit = int(torch.randint(0, f, (1,), generator=g))
            flipping[bit] = 1 - flipping[bit]
        tasks.append(Task(*sample(flipping, suite.train_per_task), *sample(flipping, suite.test_per_task)))
    return tasks


# ---------------------------------------------------------------------------- learners


def mlp(input_dim: int, hidden: int, layers: int, output_dim: int) -> nn.Sequential:
    modules: list[nn.Module] = []
    for i in range(layers):
        modules += [nn.Linear(input_dim if i == 0 else hidden, hidden), nn.ReLU()]
    return nn.Sequential(*modules, nn.Linear(hidden, output_dim))


class FullAttention(nn.Module):
    """Full softmax self-attention over the support set and the queries, read out at each query.

    Tokens: each support item embeds [x_j; y_j], each query embeds x_t. Support items attend to
    the whole support set, a query to the support set and itself (never to other queries), so a
    batch computes exactly what one sequence [S; x_t] per query would: O((|S| + B)^2) per batch.
    """

    outputs_probabilities = False

    def __init__(self, input_dim: int, label_dim: int, d_model: int = 64, num_layers: int = 2, num_heads: int = 4) -> None:
        super().__init__()
        self.embed_item = nn.Linear(input_dim + label_dim, d_model)
        self.embed_query = nn.Linear(input_dim, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, 2 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.readout = nn.Linear(d_model, label_dim)  # the "last layer" of the Hessian diagnostics

    def forward(self, query: torch.Tensor, support_x: torch.Tensor, support_y: torch.Tensor) -> torch.Tensor:
        s, b = len(support_x), len(query)
        tokens = torch.cat([self.embed_item(torch.cat([support_x, support_y], 1)), self.embed_query(query)])
        blocked = torch.ones(s + b, s + b, dtype=torch.bool)
        blocked[:, :s] = False
        blocked[s:, s:].fill_diagonal_(False)
        return self.readout(self.encoder(tokens.unsqueeze(0), mask=blocked)[0, s:])


class SupportLearner:
    """QOA or full attention: a :class:`QoaLearner` with its optimiser."""

    def __init__(self, learner: QoaLearner, lr: float, last_layer: str) -> None:
        self.learner, self.last_layer = learner, last_layer
        self.optimizer = torch.optim.Adam(learner.parameters(), lr=lr)

    def train_step(self, x, y, task) -> None:
        loss = self.learner.training_loss(x, y, task)
        if loss is not None:
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        self.learner.observe(x, y, task)

    @torch.no_grad()
    def predict(self, x, task) -> torch.Tensor:
        return self.learner(x, task)

    def hessian_problem(self, x, y, task):
        args = self.learner.prepare(x, task, train=True)
        loss = lambda out: self.learner.objective(self.learner.output(out), y)  # noqa: E731
        return self.learner.predictor, self.last_layer, args, loss


class MLPLearner:
    """An MLP trained online by backprop (Adam, as every learner here)."""

    def __init__(self, input_dim: int, output_dim: int, regression: bool, lr: float, hidden: int = 128, layers: int = 2) -> None:
        self.net = mlp(input_dim, hidden, layers, output_dim)
        self.regression = regression
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.last_layer = str(len(self.net) - 1)

    def objective(self, out, y) -> torch.Tensor:
        return F.mse_loss(out, y) if self.regression else F.cross_entropy(out, y)

    def train_step(self, x, y, task) -> None:
        self.optimizer.zero_grad()
        self.objective(self.net(x), y).backward()
        self.optimizer.step()
        self.after_step(x)

    def after_step(self, x) -> None:
        """Continual backprop hooks in here."""

    @torch.no_grad()
    def predict(self, x, task) -> torch.Tensor:
        return self.net(x)

    def hessian_problem(self, x, y, task):
        return self.net, self.last_layer, (x,), lambda out: self.objective(out, y)


class ContinualBackprop(MLPLearner):
    """Dohare et al.'s continual backprop: re-initialise mature, low-utility hidden units."""

    def __init__(self, *args, replacement_rate: float = 1e-3, maturity: int = 100, decay: float = 0.99, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rate, self.maturity, self.decay = replacement_rate, maturity, decay
        self.linears = [m for m in self.net if isinstance(m, nn.Linear)]
        self.utility = [torch.zeros(m.out_features) for m in self.linears[:-1]]
        self.age = [torch.zeros(m.out_features) for m in self.linears[:-1]]
        self.to_replace = [0.0] * len(self.utility)

    @torch.no_grad()
    def after_step(self, x) -> None:
        h = x
        for layer, (lin, out) in enumerate(zip(self.linears[:-1], self.linears[1:])):
            h = F.relu(lin(h))
            contribution = h.abs().mean(0) * out.weight.abs().sum(0)
            self.utility[layer].mul_(self.decay).add_((1 - self.decay) * contribution)
            self.age[layer] += 1
            mature = torch.nonzero(self.age[layer] > self.maturity).squeeze(1)
            self.to_replace[layer] += self.rate * len(mature)
            n = int(self.to_replace[layer])
            if n == 0:
                continue
            self.to_replace[layer] -= n
            units = mature[self.utility[layer][mature].argsort()[:n]]
            fresh = nn.Linear(lin.in_features, lin.out_features)
            lin.weight[units], lin.bias[units] = fresh.weight[units], 0.0
            out.weight[:, units] = 0.0
            self.utility[layer][units], self.age[layer][units] = 0.0, 0.0
            for tensor, index in ((lin.weight, units), (lin.bias, units), (out.weight, (slice(None), units))):
                for moment in ("exp_avg", "exp_avg_sq"):
                    if moment in self.optimizer.state.get(tensor, {}):
                        self.optimizer.state[tensor][moment][index] = 0.0


class MemoryMLPLearner:
    """Backprop (or continual backprop) with QOA's task identities and memory.

    ``base`` is an :class:`MLPLearner` whose output layer has ``heads x classes`` units; a
    row's task picks its head (one head when the memory is not task-aware). Each step trains
    on the batch plus ``replay`` items of one stored task drawn uniformly (its own head), then
    adds the batch to the memory, a :class:`QoaLearner`'s reservoir buffers, the same
    buffers QOA fills. Continual backprop's unit replacement works unchanged: it zeroes a
    replaced unit's outgoing weights in every head.
    """

    def __init__(self, base: MLPLearner, memory: QoaLearner, output_dim: int, replay: int, seed: int) -> None:
        self.base, self.memory, self.output_dim, self.replay = base, memory, output_dim, replay
        self.steps, self.seed = 0, seed

    def head_of(self, task: int) -> int:
        return task if self.memory.task_aware else 0

    def outputs(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Each row's own head's outputs."""
        out = self.base.net(x).view(len(x), -1, self.output_dim)
        return out[torch.arange(len(x)), heads]

    def train_step(self, x, y, task) -> None:
        inputs, targets, heads = x, y, torch.full((len(x),), self.head_of(task))
        replayed = self.replayed()
        if replayed is not None:
            inputs, targets, heads = (torch.cat(pair) for pair in zip((x, y, heads), replayed))
        self.base.optimizer.zero_grad()
        self.base.objective(self.outputs(inputs, heads), targets).backward()
        self.base.optimizer.step()
        self.base.after_step(inputs)
        self.memory.observe(x, y, task)  # after training on it, as QOA
        self.steps += 1

    def replayed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(x, y, head) of ``replay`` items of one stored task (uniform over the stored ones), or None."""
        keys = [k for k, b in self.memory.memory.items() if len(b)]
        if not self.replay or not keys:
            return None
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + 7) * 1_000_033 + self.steps)
        key = keys[int(torch.randint(0, len(keys), (1,), generator=g))]
        items = self.memory.memory[key].sample(self.replay, g)
        y = items["y"] if self.base.regression else items["y"].argmax(1)
        return items["x"], y, torch.full((len(y),), int(key) if self.memory.task_aware else 0)

    @torch.no_grad()
    def predict(self, x, task) -> torch.Tensor:
        return self.outputs(x, torch.full((len(x),), self.head_of(task)))

    def hessian_problem(self, x, y, task):
        # Only the task's own head, as a stand-alone layer over the (fixed) last hidden features:
        # the same parameter set, and so the same Hessian, as a single-head MLP's last layer.
        net = self.base.net
        with torch.no_grad():
            hidden = net[:-1](x)
        rows = slice(self.head_of(task) * self.output_dim, (self.head_of(task) + 1) * self.output_dim)
        with torch.random.fork_rng(devices=[]):  # its throwaway init must not move the stream's RNG
            head = nn.Linear(net[-1].in_features, self.output_dim)
        with torch.no_grad():
            head.weight.copy_(net[-1].weight[rows]), head.bias.copy_(net[-1].bias[rows])
        return nn.Sequential(head), "0", (hidden,), lambda out: self.base.objective(out, y)


def build_learner(method: str, suite: PlasticitySuite, input_dim: int, seed: int):
    torch.manual_seed(seed)
    out_dim = 1 if suite.regression else 10
    qoa_config = QoaConfig(**{
        "task": "regression" if suite.regression else "classification", "max_classes": 10, "seed": seed, **suite.qoa,
    })
    task_aware = not suite.regression  # permuted tasks share no pixels; regression shares one function
    if method == "qoa":
        return SupportLearner(QoaLearner(qoa_config, input_dim, task_aware=task_aware), suite.learning_rate, "score")
    if method == "full_attention":
        predictor = FullAttention(input_dim, qoa_config.label_dim, **suite.attention)
        return SupportLearner(QoaLearner(qoa_config, input_dim, predictor, task_aware), suite.learning_rate, "readout")
    mlp_args = {k: v for k, v in suite.mlp.items() if k in ("hidden", "layers")}
    if method == "backprop":
        return MLPLearner(input_dim, out_dim, suite.regression, suite.learning_rate, **mlp_args)
    cbp_args = {k: v for k, v in suite.mlp.items() if k in ("replacement_rate", "maturity", "decay")}
    if method == "cbp":
        return ContinualBackprop(input_dim, out_dim, suite.regression, suite.learning_rate, **mlp_args, **cbp_args)
    if method in ("backprop-memory", "cbp-memory"):
        heads = suite.n_tasks if task_aware else 1
        base = (ContinualBackprop(input_dim, out_dim * heads, suite.regression, suite.learning_rate, **mlp_args, **cbp_args)
                if method == "cbp-memory" else MLPLearner(input_dim, out_dim * heads, suite.regression, suite.learning_rate, **mlp_args))
        memory = QoaLearner(qoa_config, input_dim, predictor=nn.Identity(), task_aware=task_aware)
        return MemoryMLPLearner(base, memory, out_dim, qoa_config.support_size, seed)
    raise ValueError(f"unknown plasticity method {method!r}; known: {ALL_METHODS}")


# ---------------------------------------------------------------------------- diagnostics


def effective_rank(matrix: torch.Tensor) -> float:
    """exp(entropy) of the normalised absolute eigenvalues of a symmetric matrix."""
    # float64: LAPACK's float32 eigensolver returns NaNs on some of these ~1000x1000 Hessians.
    eig = torch.linalg.eigvalsh(((matrix + matrix.T) / 2).double()).abs()
    if eig.sum() <= 0:
        return 0.0
    p = eig / eig.sum()
    return float(torch.exp(-(p * torch.log(p.clamp_min(1e-300))).sum()))


def parameter_count(module: nn.Module, prefix: str, *_ignored) -> int:
    """Size of the parameter set ``hessian_effective_rank`` differentiates (``prefix``'s parameters)."""
    return sum(p.numel() for n, p in module.named_parameters() if n.startswith(prefix + "."))


def hessian_effective_rank(module: nn.Module, prefix: str, args: tuple, loss_of_output) -> float:
    """Effective rank of the Hessian of the loss w.r.t. the parameters under ``prefix`` only."""
    named = {n: p.detach() for n, p in module.named_parameters() if n.startswith(prefix + ".")}
    shapes = {n: p.shape for n, p in named.items()}
    flat = torch.cat([p.reshape(-1) for p in named.values()])

    def loss(vector: torch.Tensor) -> torch.Tensor:
        params, offset = {}, 0
        for name, shape in shapes.items():
            size = math.prod(shape)
            params[name] = vector[offset:offset + size].view(shape)
            offset += size
        return loss_of_output(functional_call(module, params, args))

    with torch.no_grad():  # function transforms ignore an outer no_grad; it only spares the other parameters' graph
        return effective_rank(hessian(loss)(flat).detach())


def cost_versus_support(input_dim: int, label_dim: int, suite: PlasticitySuite, sizes=(50, 100, 200, 400, 800)) -> dict:
    """FLOPs of one forward (10 queries) vs |S| for QOA and full attention, with polynomial fits."""
    config = QoaConfig(**{"max_classes": label_dim, **suite.qoa})
    g = torch.Generator().manual_seed(0)
    predictors = {"qoa": QueryOnlyAttention.from_config(config, input_dim),
                  "full_attention": FullAttention(input_dim, config.label_dim, **suite.attention)}
    report = {}
    for name, predictor in predictors.items():
        flops = [count_flops(predictor, torch.rand(10, input_dim, generator=g), torch.rand(s, input_dim, generator=g),
                             torch.rand(s, config.label_dim, generator=g)) for s in sizes]
        linear = np.polyfit(sizes, flops, 1)
        quadratic = np.polyfit(sizes, flops, 2)
        residual = np.asarray(flops) - np.polyval(linear, sizes)
        r2 = 1 - float((residual**2).sum()) / float(((np.asarray(flops) - np.mean(flops)) ** 2).sum())
        report[name] = {"support_sizes": list(sizes), "flops": flops, "flops_per_support_item": float(linear[0]),
                        "linear_fit_r2": r2, "quadratic_coefficient": float(quadratic[0])}
    return report


# ---------------------------------------------------------------------------- the stream


def score(learner, suite: PlasticitySuite, task: Task, task_id: int) -> float:
    """Accuracy, or MSE for regression, on a task's test split."""
    out = learner.predict(task.x_test, task_id)
    if suite.regression:
        return float(F.mse_loss(out, task.y_test))
    return float((out.argmax(-1) == task.y_test).float().mean())


def old_task_ids(t: int, k: int) -> list[int]:
    """Up to ``k`` earlier tasks, evenly spread from task 0 to task t-1."""
    return sorted({int(round(i)) for i in np.linspace(0, t - 1, min(k, t))}) if t else []


def run_stream(method: str, suite: PlasticitySuite, tasks: list[Task], seed: int) -> dict[str, Any]:
    learner_name, suite = suite.for_method(method)
    learner = build_learner(learner_name, suite, tasks[0].x_train.shape[1], seed)
    newest, old, erank, erank_normalised = [], [], [], []
    started = time.perf_counter()
    for t, task in enumerate(tasks):
        for x, y in zip(task.x_train.split(suite.batch_size), task.y_train.split(suite.batch_size)):
            learner.train_step(x, y, t)
        newest.append(score(learner, suite, task, t))
        last = t == len(tasks) - 1
        if (t + 1) % suite.old_eval_every == 0 or last:
            ids = old_task_ids(t, suite.old_tasks)
            if ids:
                old.append([t, float(np.mean([score(learner, suite, tasks[j], j) for j in ids]))])
        if t % suite.hessian_every == 0 or last:
            n = suite.hessian_examples
            problem = learner.hessian_problem(task.x_train[-n:], task.y_train[-n:], t)
            rank, size = hessian_effective_rank(*problem), parameter_count(*problem)
            erank.append([t, rank])
            erank_normalised.append([t, rank / size])
    final = {j: score(learner, suite, tasks[j], j) for j in old_task_ids(len(tasks) - 1, suite.old_tasks)}
    w = min(suite.window, len(tasks) // 2)
    sign = -1.0 if suite.regression else 1.0  # drop > 0 means worse on the last tasks
    return {
        "seed": seed,
        "first_window": float(np.mean(newest[:w])),
        "last_window": float(np.mean(newest[-w:])),
        "plasticity_drop": sign * float(np.mean(newest[:w]) - np.mean(newest[-w:])),
        "final_old": float(np.mean(list(final.values()))) if final else None,
        "forgetting": sign * float(np.mean([newest[j] - v for j, v in final.items()])) if final else None,
        "erank_first": erank[0][1],
        "erank_last": erank[-1][1],
        "erank_first_normalised": erank_normalised[0][1],
        "erank_last_normalised": erank_normalised[-1][1],
        "hessian_parameters": size,
        "wall_s": time.perf_counter() - started,
        "newest": newest,
        "old": old,
        "erank": erank,
        "erank_normalised": erank_normalised,
    }


SUMMARY = ("first_window", "last_window", "plasticity_drop", "final_old", "forgetting", "erank_first", "erank_last",
           "erank_first_normalised", "erank_last_normalised", "hessian_parameters", "wall_s")


def mean_curve(runs: list[dict[str, Any]], key: str) -> list[list[float]]:
    """[[task, mean, std], ...] of a curve sampled at the same tasks in every seed."""
    values = np.array([[v for _, v in r[key]] for r in runs])
    return [[t, float(m), float(sd)] for (t, _), m, sd in zip(runs[0][key], values.mean(0), values.std(0))]


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    # .get: runs written before a summary key existed merge without it
    row = {k: mean_std([r[k] for r in runs]) for k in SUMMARY if all(r.get(k) is not None for r in runs)}
    newest = np.array([r["newest"] for r in runs])
    row["curves"] = {
        "newest": [[t, float(m), float(sd)] for t, (m, sd) in enumerate(zip(newest.mean(0), newest.std(0)))],
        "old": mean_curve(runs, "old"),
        "erank": mean_curve(runs, "erank"),
        **({"erank_normalised": mean_curve(runs, "erank_normalised")} if all("erank_normalised" in r for r in runs) else {}),
    }
    row["per_seed"] = runs
    return row


# ---------------------------------------------------------------------------- the runner


def load_plasticity_suite(name_or_path: str, quick: bool) -> PlasticitySuite:
    return load_suite(PlasticitySuite, name_or_path, quick)


def run(name_or_path: str, *, methods: list[str] | None, seeds: list[int], quick: bool, out: str | Path) -> dict:
    """Entry point of ``hf-clroute bench`` for the plasticity suites (see the module docstring)."""
    suite = load_plasticity_suite(name_or_path, quick)
    methods = list(methods or suite.methods)
    unknown = [m for m in methods if m not in suite.known_methods]
    if unknown:  # before --out is created: a typo leaves no empty run directory behind
        raise ValueError(f"unknown plasticity method(s) {unknown}; known: {suite.known_methods}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    make_tasks = drifting_regression_tasks if suite.regression else permuted_mnist_tasks
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for seed in seeds:
        tasks = make_tasks(suite, seed)
        for method in methods:
            runs[method].append(run_stream(method, suite, tasks, seed))
            r = runs[method][-1]
            print(f"[{suite.name}] seed {seed} {method}: first {r['first_window']:.4f} last {r['last_window']:.4f} "
                  f"erank {r['erank_first']:.1f}->{r['erank_last']:.1f} ({r['wall_s']:.0f}s)", flush=True)
    header = {"suite": suite.name, "seeds": list(seeds), "quick": quick,
              # the dataclass fields only: the loader also notes the suite's file (source_file) on the object
              "config": {f.name: getattr(suite, f.name) for f in dataclasses.fields(suite) if f.name != "quick"}}
    return write_results(header, runs, out)


def write_results(header: dict, runs: dict[str, list[dict[str, Any]]], out: Path) -> dict:
    """Aggregate per-seed rows (+ the cost-vs-support count) into ``out``'s results.json/md and plot."""
    suite = PlasticitySuite(**header["config"])
    input_dim = suite.n_bits if suite.regression else suite.image_size**2
    results = {
        **header,
        "kind": "plasticity",
        "metric": "mse" if suite.regression else "accuracy",
        "methods": {m: aggregate(r) for m, r in runs.items()},
        "cost_vs_support": cost_versus_support(input_dim, 1 if suite.regression else 10, suite),
    }
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "plasticity.png")
    return write_run(out, results, results_markdown(results))


def _fmt(stat: dict[str, float] | None, scale: float, digits: int) -> str:
    return format_mean_std(stat, scale=scale, digits=digits, missing="n/a")


def results_markdown(results: dict) -> str:
    regression = results["metric"] == "mse"
    scale, digits, unit = (1.0, 4, "MSE") if regression else (100.0, 1, "accuracy %")
    w = min(results["config"]["window"], results["config"]["n_tasks"] // 2)
    lines = [
        f"# {results['suite']} (seeds {', '.join(map(str, results['seeds']))}{', quick' if results['quick'] else ''})\n",
        f"{results['config']['description']}\n",
        f"Newest-task {unit} after training on it, mean ± std over seeds; first/last = mean over the first/last {w} "
        "tasks; drop = first - last (" + ("last - first for MSE; " if regression else "") + "> 0: lost plasticity); "
        "old = mean over up to " + f"{results['config']['old_tasks']} earlier tasks at the end; forgetting = their "
        "newest-task score minus their final score" + (" (MSE: final - newest)" if regression else "") + "; "
        "erank = effective rank of the last layer's loss Hessian at the first and last task; erank/params = "
        "erank divided by the size of that parameter set (params; the last layers differ in size); "
        "-memory = the MLP given QOA's task identities (a head per task where QOA has a sub-buffer per task) "
        "and QOA's memory, replayed.\n",
        f"| method | first {w} | last {w} | drop | old (end) | forgetting | erank first | erank last "
        "| erank/params first | erank/params last | params | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in results["methods"].items():
        cells = [_fmt(m.get(k), scale, digits) for k in ("first_window", "last_window", "plasticity_drop", "final_old", "forgetting")]
        cells += [_fmt(m.get(k), 1.0, 1) for k in ("erank_first", "erank_last")]
        cells += [_fmt(m.get(k), 1.0, 3) for k in ("erank_first_normalised", "erank_last_normalised")]
        cells += [_fmt(m.get(k), 1.0, 0) for k in ("hessian_parameters", "wall_s")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Cost of one forward (10 queries) vs support size |S|, counted in FLOPs (torch.utils.flop_counter):", "",
              "| model | " + " | ".join(f"|S|={s}" for s in next(iter(results["cost_vs_support"].values()))["support_sizes"])
              + " | FLOPs per support item (linear fit) | linear-fit R² | |S|² coefficient (quadratic fit) |",
              "|---|" + "---|" * (len(next(iter(results["cost_vs_support"].values()))["support_sizes"]) + 3)]
    for name, c in results["cost_vs_support"].items():
        lines.append(f"| {name} | " + " | ".join(f"{f / 1e6:.2f}M" for f in c["flops"])
                     + f" | {c['flops_per_support_item']:.0f} | {c['linear_fit_r2']:.5f} | {c['quadratic_coefficient']:.1f} |")
    lines += ["", "![newest-task score and Hessian effective rank over the stream](plasticity.png)", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, m in results["methods"].items():
        for ax, key in zip(axes, ("newest", "erank")):
            t, mean, std = (np.array(v) for v in zip(*m["curves"][key]))
            ax.plot(t, mean, label=name)
            ax.fill_between(t, mean - std, mean + std, alpha=0.2)
    axes[0].set(xlabel="task", ylabel="newest-task " + ("MSE" if results["metric"] == "mse" else "accuracy"),
                title=f"{results['suite']}: plasticity")
    axes[1].set(xlabel="task", ylabel="effective rank", title="last-layer loss Hessian")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def merge(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = ()) -> dict:
    """Join runs of one plasticity suite (e.g. one per seed) and re-aggregate them."""
    return merge_seed_runs(run_dirs, out, write_results, drop)
