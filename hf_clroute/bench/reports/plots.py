"""PNG plots of a bench run, written next to results.json and embedded in model cards.

All plots read only ``results.json`` (so they can be redrawn from committed
results) and use matplotlib's Agg backend (no display on these machines). A plot
folder records what it was drawn from (:data:`STAMP`), so that `hf-clroute report`
redraws only the folders whose results or plotting code changed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from hf_clroute.hub.io import atomic_write_text  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_heatmap(name: str, matrix: list[list[float]], path: Path) -> Path:
    """R[t][j]: rows = after training task t, columns = task j's test split."""
    R = np.asarray(matrix) * 100
    fig, ax = plt.subplots(figsize=(0.6 * len(R) + 2.5, 0.5 * len(R) + 2))
    im = ax.imshow(R, vmin=0, vmax=100, cmap="viridis")
    for (t, j), value in np.ndenumerate(R):
        ax.text(j, t, f"{value:.0f}", ha="center", va="center", color="white" if value < 60 else "black", fontsize=8)
    ax.set(xlabel="evaluated on task j", ylabel="after training task t", title=f"{name}: accuracy matrix (%)")
    ax.set_xticks(range(len(R)))
    ax.set_yticks(range(len(R)))
    fig.colorbar(im, ax=ax, fraction=0.046)
    return _save(fig, path)


def _lines(results: dict[str, Any], ylabel: str, title: str, path: Path, series) -> Path:
    methods = sorted(results["methods"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    # tab20 + alternating line styles: up to 20 methods stay distinguishable.
    colors = plt.cm.tab20(np.linspace(0, 1, 20))
    for i, method in enumerate(methods):
        xs, ys = series(results["methods"][method])
        if len(xs):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=method,
                    color=colors[i % 20], linestyle=("-", "--")[i % 2])
    ax.set(xlabel=ylabel[0], ylabel=ylabel[1], title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def average_accuracy_curve(results: dict[str, Any], path: Path) -> Path:
    """A_t = mean over j <= t of R[t][j], for every method on one axis."""
    def series(row):
        R = np.asarray(row["accuracy_matrix"]) * 100
        return np.arange(1, len(R) + 1), [R[t, : t + 1].mean() for t in range(len(R))]

    return _lines(results, ("tasks learned", "average accuracy on seen tasks (%)"),
                  f"{results['suite']}: A_t over the stream", path, series)


def forgetting_per_task(results: dict[str, Any], path: Path) -> Path:
    """max_l R[l][j] - R[T][j] for each task j < T (mean over seeds)."""
    def series(row):
        R = np.asarray(row["accuracy_matrix"]) * 100
        T = len(R)
        return np.arange(T - 1), [R[j : T - 1, j].max() - R[T - 1, j] for j in range(T - 1)]

    return _lines(results, ("task j", "forgetting (points)"), f"{results['suite']}: forgetting per task", path, series)


def anytime_curve(results: dict[str, Any], path: Path) -> Path:
    """Accuracy on seen tasks every N steps (the first seed's run)."""
    def series(row):
        points = row["per_seed"][0].get("anytime") or []
        return [p[0] for p in points], [p[1] * 100 for p in points]

    return _lines(results, ("training step", "accuracy on seen tasks (%)"),
                  f"{results['suite']}: anytime accuracy", path, series)


def shallow_vs_deep(results: dict[str, Any], path: Path) -> Path | None:
    rows = {m: r for m, r in results["methods"].items() if r.get("deep_forgetting") and r.get("BWT")}
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = np.arange(len(rows))
    shallow = [-r["BWT"]["mean"] * 100 for r in rows.values()]  # the head's own A_jj - A_Tj
    deep = [r["deep_forgetting"]["mean"] * 100 for r in rows.values()]
    ax.bar(x - 0.2, shallow, 0.4, label="head (-BWT)")
    ax.bar(x + 0.2, deep, 0.4, label="deep (probe over seen classes)")
    ax.set_xticks(x, list(rows), rotation=30, ha="right")
    ax.set(ylabel="forgetting (points)", title=f"{results['suite']}: shallow vs deep forgetting")
    ax.legend(fontsize=8)
    return _save(fig, path)


def method_curves(results: dict[str, Any], path: Path) -> Path | None:
    """Method-specific series a method exposes under ``curves`` (e.g. MaRS slot count)."""
    series = [(m, k, v) for m, r in results["methods"].items() for k, v in (r.get("curves") or {}).items() if v]
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(6.5, 2.6 * len(series)), squeeze=False)
    for ax, (method, key, points) in zip(axes[:, 0], series):
        pts = np.asarray(points, dtype=float)
        ax.plot(pts[:, 0], pts[:, 1])
        ax.set(title=f"{method}: {key}", xlabel="step")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def routing_health(results: dict[str, Any], path: Path) -> Path | None:
    """Each routing method's health after every task (first seed), one line per routed layer."""
    keys = (("entropy_ratio", "entropy / log L"), ("top_weight", "top weight"), ("same_top_token", "same top token"))
    routed = [(m, r["per_seed"][0]["routing_health"]) for m, r in results["methods"].items()
              if r.get("per_seed") and r["per_seed"][0].get("routing_health")]
    if not routed:
        return None
    fig, axes = plt.subplots(len(routed), len(keys), figsize=(11, 2.8 * len(routed)), squeeze=False)
    for row, (method, history) in zip(axes, routed):
        tasks = [h["task"] for h in history]
        for ax, (key, label) in zip(row, keys):
            for layer in history[0]["layers"]:
                ax.plot(tasks, [h["layers"][layer][key] for h in history], marker="o", label=f"block {layer}")
            ax.set(title=f"{method}: {label}", xlabel="after task", ylim=(0, 1.05))
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    return _save(fig, path)


def forgetting_vs_buffer(results: dict[str, Any], path: Path) -> Path | None:
    """Head (-BWT) and deep (probe) forgetting against the replay buffer size, for rows named ``er-b<size>``."""
    rows = sorted((int(m[4:]), r) for m, r in results["methods"].items()
                  if m.startswith("er-b") and m[4:].isdigit() and r.get("deep_forgetting") and r.get("BWT"))
    if len(rows) < 2:
        return None
    sizes = np.array([n for n, _ in rows], dtype=float)
    x = np.where(sizes > 0, sizes, 1.0)  # buffer 0 drawn at 1 on the log axis
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, get in (("head forgetting (-BWT)", lambda r: -np.array([r["BWT"]["mean"], -r["BWT"]["std"]])),
                       ("deep forgetting (probe)",
                        lambda r: np.array([r["deep_forgetting"]["mean"], r["deep_forgetting"]["std"]]))):
        values = np.array([get(r) for _, r in rows]) * 100
        ax.errorbar(x, values[:, 0], yerr=np.abs(values[:, 1]), marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(x, [str(int(n)) for n in sizes])
    ax.set(xlabel="replay buffer (examples)", ylabel="forgetting (points)",
           title=f"{results['suite']}: forgetting vs buffer size")
    ax.legend(fontsize=8)
    return _save(fig, path)


#: the file in a plot folder naming what its plots were drawn from (:func:`drawn_from`)
STAMP = ".drawn-from"


def drawn_from(results: dict[str, Any]) -> str:
    """A fingerprint of what a run's plots show: its results and this module's code (a change to either
    redraws them)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(results, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """Every plot of a bench run, as PNG files in ``out``; returns their paths. A folder already drawn from
    the same results by the same code is left as it is (drawing is most of `hf-clroute report`'s time)."""
    out.mkdir(parents=True, exist_ok=True)
    fingerprint, stamp = drawn_from(results), out / STAMP
    heatmaps = [out / f"accuracy_matrix_{method}.png" for method in results["methods"]]
    if stamp.is_file() and stamp.read_text().strip() == fingerprint and all(p.is_file() for p in heatmaps):
        return sorted(out.glob("*.png"))
    paths = [
        average_accuracy_curve(results, out / "average_accuracy.png"),
        forgetting_per_task(results, out / "forgetting_per_task.png"),
        anytime_curve(results, out / "anytime_accuracy.png"),
        shallow_vs_deep(results, out / "shallow_vs_deep.png"),
        method_curves(results, out / "method_curves.png"),
        routing_health(results, out / "routing_health.png"),
        forgetting_vs_buffer(results, out / "forgetting_vs_buffer.png"),
    ]
    for method, row in results["methods"].items():
        paths.append(accuracy_heatmap(method, row["accuracy_matrix"], out / f"accuracy_matrix_{method}.png"))
    atomic_write_text(stamp, fingerprint + "\n")
    return [p for p in paths if p is not None]
