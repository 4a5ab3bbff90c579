"""One resolver for a run's settings: (suite, method, seed, overrides) -> adapter config + training config.

Precedence, lowest to highest (a later layer replaces a field an earlier one set):

1. the dataclass defaults of ``TrainingConfig`` and of the method's config class;
2. the method's settings file (``config`` and ``training``), then its per-suite blocks
   ``suites.<key>``, for each key of the suite's lineage from its farthest ``base`` to the suite
   itself. A registered method's file is ``configs/methods/<method>.json``; a named variant's,
   ``configs/variants/<name>.json``, and a study ablation's, ``configs/ablations/<name>.json``:
   those name the method they configure (``"method": "lora"``, or another variant), whose file
   applies first;
3. the suite's ``training`` block (with ``--quick``, the suite's ``quick`` block is
   merged into the suite first, key by key) and the suite's ``scenario``: what the suite's
   author wrote for every method takes effect over the library's per-method settings;
4. the suite file's own ``method_settings.<method>`` block (the same author, one method);
5. the hyper-parameters ``hf-clroute tune`` chose on the validation split (``selected``:
   ``{"training.learning_rate": ..., "config.<field>": ...}``), passed with ``--selection``;
6. explicit overrides: a run config's ``training`` block, then the command line's flags
   (``config_overrides`` for the adapter config);
7. the run seed: ``TrainingConfig.seed`` and every adapter-config field named ``seed``
   or ending in ``_seed`` (head rows, routers, memories, buffers, PEFT init), so one
   seed drives every random choice of a run. A suite or run config that sets one of
   these is refused (the seed comes from ``--seeds`` / ``--seed``), never overridden.

Every value is type- and range-checked before anything trains; an error names the file
(or layer) that wrote the value and the field. ``RunSettings.sources`` says, for every
field set above the defaults, which layer set it; ``--show-settings`` prints it and every
run records it (``results.json``, a train run's ``result.json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_clroute.core.config import CLConfig
from hf_clroute.core.registry import canonical_name, get_method
from hf_clroute.engine import TrainingConfig
from hf_clroute.errors import UserInputError

CONFIG_ROOT = Path(__file__).resolve().parents[1] / "configs"  # package data: installed with the wheel
#: the folders of settings files under CONFIG_ROOT: the registered methods, the named variants a user
#: would pick, and the studies' ablations and controls (``hf-clroute methods --all`` lists them).
SETTINGS_FOLDERS = ("methods", "variants", "ablations")


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


def settings_path(method: str) -> Path | None:
    """The settings file of a method, variant or ablation (an old ``_`` spelling of its name too), or None."""
    name = canonical_name(method)
    paths = [CONFIG_ROOT / folder / f"{name}.json" for folder in SETTINGS_FOLDERS]
    return next((path for path in paths if path.is_file()), None)


def settings_label(path: Path) -> str:
    """How a settings file is named in ``RunSettings.sources``: ``configs/<folder>/<name>.json``."""
    return f"configs/{path.parent.name}/{path.name}"


def method_file(method: str) -> dict[str, Any]:
    """The settings file of ``method`` as a dict ({} when it has none). A registered method's file is named
    by its file name alone; a variant's or ablation's names the method it configures (``"method"``)."""
    path = settings_path(method)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"method settings file {path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise UserInputError(f"method settings file {path} must hold a JSON object, not a {type(data).__name__}")
    registered = path.parent.name == "methods"
    if registered == ("method" in data):
        raise UserInputError(f"method settings file {path}: " + (
            "a registered method's file is named by its file name; remove its 'method' key" if registered
            else "a variant's file must name the method it configures ('method')"))
    return data


def method_layers(method: str, lineage: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(source label, {"config": ..., "training": ...}) layers of the method files, lowest first."""
    path, data = settings_path(method), method_file(method)
    layers = method_layers(data["method"], lineage) if "method" in data else []
    if path is None:
        return layers
    layers.append((settings_label(path), data))
    for key in lineage:
        block = data.get("suites", {}).get(key)
        if block:
            layers.append((f"{settings_label(path)} suites.{key}", block))
    return layers


def registered_method(method: str) -> str:
    """The registered method a variant (or a variant of a variant) configures; a method names itself."""
    data = method_file(method)
    return registered_method(data["method"]) if "method" in data else canonical_name(method)


def suite_source(suite: Any) -> str:
    """Where a suite's values were written, for messages: its file, else its name."""
    path = getattr(suite, "source_file", None)
    return f"suite file {path}" if path else f"suite {suite.name!r}"


def resolve_run(suite: Any, method: str, seed: int, overrides: dict[str, Any] | None = None,
                config_overrides: dict[str, Any] | None = None, selected: dict[str, Any] | None = None,
                overrides_source: str = "overrides") -> RunSettings:
    """The adapter and training configs of one run; see the module docstring for the precedence.
    ``overrides_source`` names where ``overrides`` came from (a run config file, the command line)."""
    lineage = [*reversed(suite.bases), suite.name]
    layers: list[tuple[str, dict[str, Any]]] = method_layers(method, lineage)
    settings_files = {label for label, _ in layers}
    layers.append(("suite training", {"config": {}, "training": suite.training}))
    own = next((block for name, block in suite.method_settings.items()
                if canonical_name(name) == canonical_name(method)), None)
    if own:
        layers.append((f"suite {suite.name} method_settings.{method}", own))
    if selected:
        layers.append(("selection (validation)", unflatten(selected)))
    layers.append((overrides_source, {"config": config_overrides or {}, "training": overrides or {}}))

    config_fields: dict[str, Any] = {"scenario": suite.scenario}
    training_fields: dict[str, Any] = {}
    sources = {"config.scenario": "suite"}
    for label, layer in layers:
        where = suite_source(suite) if label == "suite training" else label
        for part in ("config", "training"):
            if not isinstance(layer.get(part, {}), dict):
                raise UserInputError(f"{where}: {part!r} must be a JSON object of fields, got {layer[part]!r}")
        for name, value in layer.get("config", {}).items():
            config_fields[name], sources[f"config.{name}"] = value, label
        for name, value in layer.get("training", {}).items():
            check_training_value(name, value, where)
            training_fields[name], sources[f"training.{name}"] = value, label

    registered = registered_method(method)
    config_class = get_method(registered).config_class
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(config_fields) - known)
    if unknown:
        raise UserInputError(f"settings for method {method!r} name unknown {config_class.__name__} field(s) {unknown} "
                             f"(from {sorted({sources['config.' + k] for k in unknown})})")
    seeded = ["training.seed"] + [f"config.{n}" for n in sorted(known) if n == "seed" or n.endswith("_seed")]
    written = [key for key in seeded if key in sources and sources[key] not in settings_files]
    if written:  # the run seed would replace it: refuse rather than override what the user wrote
        raise UserInputError(f"{', '.join(written)} set by {sources[written[0]]!r}: seeds come from the run seed "
                             "(--seeds / --seed / a run config's 'seed'); remove it")
    for key in seeded[1:]:
        config_fields[key.split(".", 1)[1]], sources[key] = seed, "run seed"
    training_fields["seed"], sources["training.seed"] = seed, "run seed"
    if "max_grad_norm" in training_fields and training_fields["max_grad_norm"] is None:
        training_fields["max_grad_norm"] = 0.0  # null in a file: no clipping, TrainingConfig's 0
    known_training = {f.name for f in dataclasses.fields(TrainingConfig)}
    unknown = sorted(set(training_fields) - known_training)
    if unknown:
        raise UserInputError(f"training settings for method {method!r} name unknown TrainingConfig field(s) {unknown} "
                             f"(from {sorted({sources['training.' + k] for k in unknown})})")
    try:
        config, training = config_class(**config_fields), TrainingConfig(**training_fields)
    except (TypeError, ValueError) as err:  # the config classes' own checks, named with the run
        raise UserInputError(f"settings of method {method!r} on suite {suite.name!r}: {err}") from err
    return RunSettings(method, registered, config, training, sources)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: TrainingConfig fields a file may write -> (check, what it must be). A value of another
#: type is refused, never converted: "10" is not 10, 1.5 epochs is not 1.
TRAINING_CHECKS: dict[str, tuple[Any, str]] = {
    **{name: (lambda v: _integer(v) and v >= 1, "an integer >= 1")
       for name in ("epochs", "batch_size", "eval_batch_size", "prefetch_factor")},
    **{name: (lambda v: _integer(v) and v >= 0, "an integer >= 0")
       for name in ("eval_every", "evals_per_task", "checkpoint_every", "keep_checkpoints", "stop_after_steps",
                    "eval_cache_examples")},
    "num_workers": (lambda v: _integer(v) and v >= -1, "an integer >= 0, or -1 (auto)"),
    "learning_rate": (lambda v: _number(v) and v > 0, "a finite number > 0"),
    "weight_decay": (lambda v: _number(v) and v >= 0, "a finite number >= 0"),
    "eval_cache_mb": (lambda v: _number(v) and v >= 0, "a finite number >= 0"),
    "max_grad_norm": (lambda v: v is None or (_number(v) and v >= 0), "a finite number > 0, 0 or null (no clipping)"),
    "progress": (lambda v: isinstance(v, bool), "true or false"),
    "pin_memory": (lambda v: v is None or isinstance(v, bool), "true, false or null (auto)"),
    "optimizer": (lambda v: v in ("adamw", "sgd"), "'adamw' or 'sgd'"),
    "precision": (lambda v: v in (None, "auto", "bf16", "fp32"), "'auto', 'bf16', 'fp32' or null (the environment's)"),
    **{name: (lambda v: v is None or isinstance(v, str), "a string or null")
       for name in ("checkpoint_dir", "log_with")},
    "seed": (_integer, "an integer"),
}


def check_training_value(name: str, value: Any, where: str) -> None:
    """Refuse a TrainingConfig value of the wrong type or range, naming ``where`` (a file) and the field.
    Fields without a check here (added by the engine later) are left to ``TrainingConfig`` itself."""
    check = TRAINING_CHECKS.get(name)
    if check and not check[0](value):
        raise UserInputError(f"{where}: training.{name} must be {check[1]}, got {value!r}")


def check_training_block(block: Any, where: str) -> None:
    """Every value of a ``training`` block (see :func:`check_training_value`)."""
    if not isinstance(block, dict):
        raise UserInputError(f"{where}: 'training' must be a JSON object of TrainingConfig fields, got {block!r}")
    for name, value in block.items():
        check_training_value(name, value, where)


def describe_settings(settings: RunSettings) -> str:
    """The resolved settings, one ``field = value  (source)`` line each, for ``--show-settings``."""
    values = {**{f"config.{k}": v for k, v in settings.adapter_config.to_dict().items() if k != "method"},
              **{f"training.{k}": v for k, v in dataclasses.asdict(settings.training).items()}}
    width = max(len(k) for k in values)
    lines = [f"{settings.method} ({settings.registered_method}): {len(settings.sources)} of {len(values)} fields set "
             "above the defaults"]
    lines += [f"  {key:{width}s} = {json.dumps(value, default=str)}  ({settings.sources.get(key, 'default')})"
              for key, value in sorted(values.items())]
    return "\n".join(lines)


def method_description(method: str) -> str:
    """The description in the method's (or variant's) settings file ("" if none)."""
    return method_file(method).get("description", "")


def method_summary(method: str) -> str:
    """The one short line ``hf-clroute methods`` prints: what the method or variant is ("" if none)."""
    return method_file(method).get("summary", "")


def method_variants(folders: tuple[str, ...] = ("variants", "ablations")) -> list[tuple[str, str]]:
    """(variant, the method it configures) for every settings file in ``folders``, by name."""
    paths = sorted((path for folder in folders for path in (CONFIG_ROOT / folder).glob("*.json")), key=lambda p: p.stem)
    return [(path.stem, method_file(path.stem)["method"]) for path in paths]


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
            raise UserInputError(f"setting {key!r} must be 'config.<field>' or 'training.<field>'")
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
