"""The plasticity suites' ``results.md`` table and ``plasticity.png`` (written by
:mod:`hf_clroute.bench.runners.plasticity`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hf_clroute.metrics import format_mean_std


def _fmt(stat: dict[str, float] | None, scale: float, digits: int) -> str:
    return format_mean_std(stat, scale=scale, digits=digits, missing="n/a")


def results_markdown(results: dict) -> str:
    regression = results["metric"] == "mse"
    scale, digits, unit = (1.0, 4, "MSE") if regression else (100.0, 1, "accuracy %")
    w = min(results["config"]["window"], results["config"]["n_tasks"] // 2)
    lines = [
        f"# {results['suite']} (seeds {', '.join(map(str, results['seeds']))}"
        f"{', quick' if results['quick'] else ''})\n",
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
        cells = [_fmt(m.get(k), scale, digits)
                 for k in ("first_window", "last_window", "plasticity_drop", "final_old", "forgetting")]
        cells += [_fmt(m.get(k), 1.0, 1) for k in ("erank_first", "erank_last")]
        cells += [_fmt(m.get(k), 1.0, 3) for k in ("erank_first_normalised", "erank_last_normalised")]
        cells += [_fmt(m.get(k), 1.0, 0) for k in ("hessian_parameters", "wall_s")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    sizes = next(iter(results["cost_vs_support"].values()))["support_sizes"]
    lines += ["", "Cost of one forward (10 queries) vs support size |S|, counted in FLOPs (torch.utils.flop_counter):",
              "", "| model | " + " | ".join(f"|S|={s}" for s in sizes)
              + " | FLOPs per support item (linear fit) | linear-fit R² | |S|² coefficient (quadratic fit) |",
              "|---|" + "---|" * (len(sizes) + 3)]
    for name, c in results["cost_vs_support"].items():
        lines.append(f"| {name} | " + " | ".join(f"{f / 1e6:.2f}M" for f in c["flops"])
                     + f" | {c['flops_per_support_item']:.0f} | {c['linear_fit_r2']:.5f} "
                     f"| {c['quadratic_coefficient']:.1f} |")
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
