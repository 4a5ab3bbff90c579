"""Continual-learning metrics: pure functions, seed aggregation and an offline ``evaluate`` module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_clroute.metrics.aggregate import aggregate_runs, format_mean_std, mean_std
from hf_clroute.metrics.continual import (
    SCENARIOS,
    SUMMARY_KEYS,
    anytime_accuracy,
    average_incremental_accuracy,
    backward_transfer,
    final_average_accuracy,
    forgetting,
    forward_transfer,
    perplexity_retention,
    retention,
    summarize,
)

#: Folder of the local ``evaluate`` module (folder and script share the name, as evaluate requires).
METRIC_PATH: Path = Path(__file__).resolve().parent / "continual_learning"


def load_metric(**kwargs: Any):
    """``evaluate.load`` of the packaged continual-learning metric (offline; kwargs go to ``evaluate.load``)."""
    import evaluate

    return evaluate.load(str(METRIC_PATH), **kwargs)


__all__ = [
    "METRIC_PATH",
    "SCENARIOS",
    "SUMMARY_KEYS",
    "aggregate_runs",
    "anytime_accuracy",
    "average_incremental_accuracy",
    "backward_transfer",
    "final_average_accuracy",
    "forgetting",
    "forward_transfer",
    "load_metric",
    "format_mean_std",
    "mean_std",
    "perplexity_retention",
    "retention",
    "summarize",
]
