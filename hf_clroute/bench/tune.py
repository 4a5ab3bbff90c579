"""`hf-clroute tune`: choose each method's hyper-parameters on the validation split, never on test.

Every gradient-trained method searches the same learning rates (``LEARNING_RATES``)
times at most two knobs of its own (``"search"`` in its settings file); a method with
nothing to train searches its knobs alone. At most ``MAX_CONFIGS`` configurations
per method, one seed (``seed``, default 0). Each configuration runs the suite's
stream with every test split replaced by the validation split carved from the
training data (``validation_per_class``), and the configuration with the best
validation A_T is picked (ties: the first in grid order). ``selection.json``
records the grid, every validation score and the pick; ``hf-clroute bench
--selection`` trains with the picks and copies the record into results.json.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

from ..data.collate import decode_stream_if_small
from ..data.streams import validation_stream
from ..io import atomic_write_text
from ..model import get_cl_model
from .classification import run_method, summarize_result
from .feature_cache import FeatureCollator, cache_stream_features
from .settings import method_search, resolve_run
from .suites import SuiteConfig, build_stream, load_suite_backbone

LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
MAX_CONFIGS = 12
MAX_KNOBS = 2


def search_grid(method: str, trains: bool) -> list[dict[str, Any]]:
    """The configurations ``method`` is tried with, as flat ``{"training.x" | "config.x": value}`` points."""
    knobs = method_search(method)
    if len(knobs) > MAX_KNOBS:
        raise ValueError(f"method {method!r} searches {sorted(knobs)}: at most {MAX_KNOBS} knobs of its own")
    axes = ({"training.learning_rate": list(LEARNING_RATES)} if trains else {}) | knobs
    grid = [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else [{}]
    if len(grid) > MAX_CONFIGS:
        raise ValueError(f"method {method!r}: {len(grid)} configurations exceed the budget of {MAX_CONFIGS}")
    return grid


def tune(suite: SuiteConfig, methods: list[str], out: Path, seed: int = 0, command: str | None = None,
         progress: bool = False) -> dict[str, Any]:
    if not suite.validation_per_class:
        raise ValueError(f"suite {suite.name!r} has no validation split (set validation_per_class)")
    # No probes while tuning, and no anytime evaluations: only the validation A_T decides.
    quiet = dataclasses.replace(suite, probe_forgetting=False)
    backbone, collator = load_suite_backbone(suite)
    stream = decode_stream_if_small(validation_stream(build_stream(suite, seed)), collator)
    record: dict[str, Any] = {}
    cached_stream = None
    for method in methods:
        model = get_cl_model(copy.deepcopy(backbone), resolve_run(suite, method, seed).adapter_config)
        trains, frozen = bool(model.trainable_parameters()), model.reads_frozen_features()
        if frozen and cached_stream is None:
            cached_stream, _ = cache_stream_features(backbone, stream, collator)
        grid, scores = search_grid(method, trains), []
        for point in grid:
            started = time.perf_counter()
            settings = {k[len("training."):]: v for k, v in point.items() if k.startswith("training.")}
            config = {k[len("config."):]: v for k, v in point.items() if k.startswith("config.")}
            result, _, _ = run_method(
                quiet, method, seed, stream=cached_stream if frozen else stream,
                collator=FeatureCollator() if frozen else None, config_overrides=config,
                progress=progress, eval_every=0, evals_per_task=0, **settings,
            )
            scores.append(summarize_result(result, suite.scenario)["A_T"])
            print(f"[tune {suite.name}] {method} {point}: validation A_T {scores[-1]:.4f} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)
        best = max(range(len(grid)), key=lambda i: (scores[i], -i))
        record[method] = {"grid": grid, "validation_A_T": scores, "pick": grid[best], "seed": seed,
                          "metric": "A_T on the validation split"}
    selection = {"suite": suite.name, "methods": record, "learning_rates": list(LEARNING_RATES),
                 "commands": [command] if command else []}
    path = out / "selection.json"
    if path.is_file():  # tuning more methods adds to the same file
        previous = json.loads(path.read_text())
        if previous.get("suite") == suite.name:
            selection["methods"] = {**previous["methods"], **record}
            selection["commands"] = previous.get("commands", []) + selection["commands"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(selection, indent=2, sort_keys=True) + "\n")
    return selection
