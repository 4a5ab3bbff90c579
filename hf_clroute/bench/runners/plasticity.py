"""Plasticity suites: permuted MNIST at 7x7 and slowly changing regression.

``hf-clroute bench --suite permuted-mnist`` (or ``drifting-regression``) runs, over the same stream
and seeds, online learners on raw inputs: ``qoa``, ``full_attention``, ``backprop``, ``cbp``,
``backprop-memory`` and ``cbp-memory`` (:mod:`~hf_clroute.bench.runners.plasticity_learners`). The
suite file and its streams: :mod:`~hf_clroute.bench.runners.plasticity_suite`; the table and the
plot: :mod:`~hf_clroute.bench.reports.plasticity_report`.

A suite's ``method_settings`` names further rows, each one of these learners with some of the
suite's blocks overridden, e.g. ``"qoa-s1000": {"method": "qoa", "qoa": {"support_size": 1000}}``:
the same stream and seeds, so a variant is paired with every other row seed by seed.

Plasticity diagnostics, per task: accuracy (MSE for regression) on the newest task's test
split after training on it (plasticity), accuracy on a spread of earlier tasks every few
tasks (forgetting), and the effective rank of the loss Hessian w.r.t. the *last layer's*
parameters (as in the paper) on the task's last training examples. The last layers differ in
size (QOA's scorer output: hidden + 1 parameters; an MLP head: (hidden + 1) x classes), and the
rank is bounded by it, so the results also give ``erank / parameters`` of that set
(``erank_*_normalised``), and the FLOPs of QOA and full attention for growing support sizes.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F

from hf_clroute.bench.harness.results import write_run
from hf_clroute.bench.harness.suites import merge_seed_runs
from hf_clroute.bench.reports.plasticity_report import plot, results_markdown
from hf_clroute.bench.runners.plasticity_learners import (
    build_learner,
    cost_versus_support,
    hessian_effective_rank,
    parameter_count,
)
from hf_clroute.bench.runners.plasticity_suite import (
    PlasticitySuite,
    Task,
    drifting_regression_tasks,
    load_plasticity_suite,
    permuted_mnist_tasks,
)
from hf_clroute.metrics import mean_std


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
        **({"erank_normalised": mean_curve(runs, "erank_normalised")}
           if all("erank_normalised" in r for r in runs) else {}),
    }
    row["per_seed"] = runs
    return row


# ---------------------------------------------------------------------------- the runner


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


def merge(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = ()) -> dict:
    """Join runs of one plasticity suite (e.g. one per seed) and re-aggregate them."""
    return merge_seed_runs(run_dirs, out, write_results, drop)
