"""The plasticity suite file (:class:`PlasticitySuite`) and its two streams of small tasks.

Permuted MNIST at 7x7 (:func:`permuted_mnist_tasks`) and Dohare et al.'s slowly changing regression
(:func:`drifting_regression_tasks`), the bit-flipping problem the QOA paper and continual backprop use:
inputs are ``n_bits`` bits, the first ``n_flipping`` of which stay fixed within a task and one of
them flips at every task boundary, the rest are random per example; the target is a fixed random
network of linear threshold units (scaled by 1/sqrt(width)). The function never changes; the input
distribution drifts slowly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hf_clroute.bench.harness.suites import load_suite

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


def load_plasticity_suite(name_or_path: str, quick: bool) -> PlasticitySuite:
    return load_suite(PlasticitySuite, name_or_path, quick)
