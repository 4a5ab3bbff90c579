"""One resolver for a run's settings: (suite, method, seed, overrides) -> adapter config + training config.

Precedence, lowest to highest (a later layer replaces a field an earlier one set):

1. the dataclass defaults of ``TrainingConfig`` and of the method's config class;
2. the suite's ``training`` block (with ``--quick``, the suite's ``quick`` block is
   merged into the suite first, key by key) and the suite's ``scenario``;
3. the method's settings file ``configs/methods/<method>.json`` (``config`` and
   ``training``); a variant file (``"method": "lora"``) applies its method's file first;
4. per-suite blocks: ``suites.<key>`` in the method file, for each key of the suite's
   lineage from its farthest ``base`` to the suite itself, then the suite file's own
   ``method_settings.<method>`` block;
5. the hyper-parameters ``hf-clroute tune`` chose on the validation split (``selected``:
   ``{"training.learning_rate": ..., "config.<field>": ...}``);
6. explicit overrides (a run config's ``training``, the bench's flags; ``config_overrides``);
7. the run seed: ``TrainingConfig.seed`` and every adapter-config field named ``seed``
   or ending in ``_seed`` (head rows, routers, memories, buffers, PEFT init), so one
   seed drives every random choice of a run.

``RunSettings.sources`` says, for every field set above the defaults, which layer set it;
the bench logs it and records it in results.json.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import CLConfig
from ..engine import TrainingConfig
from ..registry import get_method

CONFIG_ROOT = Path(__file__).resolve().parent / "configs"  # package data: installed with the wheel


@dataclass
class RunSettings:
    """What one (suite, method, seed) run uses, and where each setting came from."""

    method: str
    registered_method: str
    adapter_config: CLConfig
    training: TrainingConfig
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "adapter_config": self.adapter_config.to_dict(),
            "training": dataclasses.asdict(self.training),
            "sources": dict(sorted(self.sources.items())),
        }


def method_file(method: str) -> dict[str, Any]:
    path = CONFIG_ROOT / "methods" / f"{method}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def method_layers(method: str, lineage: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(source label, {"config": ..., "training": ...}) layers of the method files, lowest first."""
    data = method_file(method)
    registered = data.get("method", method)
    layers = method_layers(registered, lineage) if registered != method else []
    layers.append((f"configs/methods/{method}.json", data))
    for key in lineage:
        block = data.get("suites", {}).get(key)
        if block:
            layers.append((f"configs/methods/{method}.json suites.{key}", block))
    return layers


def registered_method(method: str) -> str:
    data = method_file(method)
    registered = data.get("method", method)
    return registered if registered == method else registered_method(registered)


def resolve_run(suite: Any, method: str, seed: int, overrides: dict[str, Any] | None = None,
                config_overrides: dict[str, Any] | None = None, selected: dict[str, Any] | None = None) -> RunSettings:
    """The adapter and training configs of one run; see the module docstring for the precedence."""
    lineage = [*reversed(suite.bases), suite.name]
    layers: list[tuple[str, dict[str, Any]]] = [("suite training", {"config": {}, "training": suite.training})]
    layers += method_layers(method, lineage)
    own = suite.method_settings.get(method)
    if own:
        layers.append((f"suite {suite.name} method_settings.{method}", own))
    if selected:
        layers.append(("selection (validation)", unflatten(selected)))
    layers.append(("overrides", {"config": config_overrides or {}, "training": overrides or {}}))

    config_fields: dict[str, Any] = {"scenario": suite.scenario}
    training_fields: dict[str, Any] = {}
    sources = {"config.scenario": "suite"}
    for label, layer in layers:
        for name, value in layer.get("config", {}).items():
            config_fields[name], sources[f"config.{name}"] = value, label
        for name, value in layer.get("training", {}).items():
            training_fields[name], sources[f"training.{name}"] = value, label

    registered = registered_method(method)
    config_class = get_method(registered).config_class
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(config_fields) - known)
    if unknown:
        raise ValueError(f"settings for method {method!r} name unknown {config_class.__name__} field(s) {unknown} "
                         f"(from {sorted({sources['config.' + k] for k in unknown})})")
    for name in sorted(known):
        if name == "seed" or name.endswith("_seed"):
            config_fields[name], sources[f"config.{name}"] = seed, "run seed"
    training_fields["seed"], sources["training.seed"] = seed, "run seed"
    known_training = {f.name for f in dataclasses.fields(TrainingConfig)}
    unknown = sorted(set(training_fields) - known_training)
    if unknown:
        raise ValueError(f"training settings for method {method!r} name unknown TrainingConfig field(s) {unknown} "
                         f"(from {sorted({sources['training.' + k] for k in unknown})})")
    return RunSettings(method, registered, config_class(**config_fields), TrainingConfig(**training_fields), sources)


def method_description(method: str) -> str:
    """The one-line description in ``configs/methods/<method>.json`` ("" if none)."""
    return method_file(method).get("description", "")


def method_variants() -> list[tuple[str, str]]:
    """(variant, registered method) for every settings file that configures another method."""
    variants = []
    for path in sorted((CONFIG_ROOT / "methods").glob("*.json")):
        method = json.loads(path.read_text()).get("method", path.stem)
        if method != path.stem:
            variants.append((path.stem, method))
    return variants


def merged_method_settings(method: str, lineage: list[str]) -> dict[str, dict[str, Any]]:
    """Layers 3-4 alone (method files and their per-suite blocks), merged: ``{"config", "training"}``."""
    merged: dict[str, dict[str, Any]] = {"config": {}, "training": {}}
    for _, layer in method_layers(method, lineage):
        for part in merged:
            merged[part].update(layer.get(part, {}))
    return merged


def unflatten(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"training.learning_rate": 1e-3, "config.k": 5}`` -> ``{"training": {...}, "config": {...}}``."""
    layer: dict[str, dict[str, Any]] = {"config": {}, "training": {}}
    for key, value in values.items():
        part, _, name = key.partition(".")
        if part not in layer or not name:
            raise ValueError(f"setting {key!r} must be 'config.<field>' or 'training.<field>'")
        layer[part][name] = value
    return layer


def method_search(method: str) -> dict[str, Any]:
    """The method's own tuning knobs (``"search"`` in its settings file: axes, or ``"points"``). A variant
    without a ``"search"`` inherits its method's; one with its own searches that alone (it replaces, so a
    variant can change the knobs and still keep the search budget of ``hf-clroute tune``)."""
    data = method_file(method)
    registered = data.get("method", method)
    if "search" in data or registered == method:
        return dict(data.get("search", {}))
    return method_search(registered)


def load_selection(path: str | Path, suite: Any) -> dict[str, Any]:
    """``selection.json`` of ``suite`` (refused when it was tuned on another suite)."""
    selection = json.loads(Path(path).read_text())
    if selection.get("suite") != suite.name:
        raise ValueError(f"selection {path} was tuned on suite {selection.get('suite')!r}, not {suite.name!r}")
    return selection["methods"]
