"""The online learners of the plasticity suites, and the Hessian ranks and FLOPs they are compared by.

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

The effective rank of the loss Hessian w.r.t. the *last layer's* parameters (the exact Hessian via
``torch.func.hessian``) is ``erank = exp(H(p))`` with ``p_i = |lambda_i| / sum |lambda|`` (Roy &
Vetterli 2007). The cost of QOA and of full attention is counted in FLOPs
(``torch.utils.flop_counter``) for growing support sizes and fitted: QOA's is linear in |S|, full
attention's quadratic.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, hessian

from hf_clroute.bench.harness.flops import count_flops
from hf_clroute.bench.runners.plasticity_suite import ALL_METHODS, PlasticitySuite
from hf_clroute.methods.qoa import QoaConfig, QoaLearner, QueryOnlyAttention


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

    def __init__(self, input_dim: int, label_dim: int, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4) -> None:
        super().__init__()
        self.embed_item = nn.Linear(input_dim + label_dim, d_model)
        self.embed_query = nn.Linear(input_dim, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, 2 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
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

    def __init__(self, input_dim: int, output_dim: int, regression: bool, lr: float, hidden: int = 128,
                 layers: int = 2) -> None:
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

    def __init__(self, *args, replacement_rate: float = 1e-3, maturity: int = 100, decay: float = 0.99,
                 **kwargs) -> None:
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
        shape = (input_dim, out_dim * heads, suite.regression, suite.learning_rate)
        base = (ContinualBackprop(*shape, **mlp_args, **cbp_args) if method == "cbp-memory"
                else MLPLearner(*shape, **mlp_args))
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
