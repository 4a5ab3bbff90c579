"""Benchmark suites: a dataset, a stream recipe, a backbone and the methods to run.

A suite is a JSON file (``hf_clroute/configs/suites/<name>.json``), so a user can define one
over any dataset (a source name, a local path or a Hub id, with named columns)
without writing code. ``--quick`` applies the suite's ``quick`` overrides: the
same stream with fewer examples, for CI and the demo.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from hf_clroute.bench.harness.settings import (
    CONFIG_ROOT,
    check_training_block,
    suite_source,
)
from hf_clroute.core.registry import canonical_name
from hf_clroute.errors import UserInputError
from hf_clroute.metrics import SCENARIOS


@dataclass
class SuiteConfig:
    """One benchmark: everything but the seed and the method."""

    name: str = field(metadata={"help": "Suite name, used in results."})
    dataset: str = field(metadata={"help": "Source name (see `hf-clroute data list`), local path or Hub dataset id."})
    backbone: str = field(
        metadata={"help": "'pretrained-vit:<recipe>', 'minilm', a local checkpoint dir or a Hub model id."}
    )
    runner: str = field(
        default="classification", metadata={"help": "Which runner: classification (this one), charlm, plasticity."})
    input_column: str | None = field(default=None, metadata={"help": "Image/text column (None: infer)."})
    label_column: str = field(default="label", metadata={"help": "Label column."})
    train_split: str = field(default="train", metadata={"help": "The dataset's split the training stream comes from."})
    test_split: str | None = field(
        default="test",
        metadata={"help": "The dataset's test split; null (or a split the dataset lacks) = carve test_fraction "
                          "of train_split out as the test set, with a fixed seed (e.g. ImageNet-R, one split)."},
    )
    test_fraction: float = field(
        default=0.2, metadata={"help": "Share of train_split held out as the test set when there is no test_split."}
    )
    image_size: int | None = field(
        default=None,
        metadata={"help": "Side of the square images the backbone is fed (the image processor's size); null = the "
                          "processor's own. Must equal the ViT's image_size: its position embeddings are fixed."},
    )
    scenario: str = field(default="class", metadata={"help": "'class', 'domain' or 'task' incremental."})
    n_tasks: int = field(default=5, metadata={"help": "Number of experiences."})
    min_examples_per_class: int = field(
        default=0, metadata={"help": "Keep only classes with at least this many training examples (0 = all)."}
    )
    max_classes: int = field(default=0, metadata={"help": "Keep at most this many classes (0 = all)."})
    validation_per_class: int = field(
        default=0,
        metadata={"help": "Training examples per class held out as the validation split (disjoint from the training "
                          "stream and from test) on which `hf-clroute tune` chooses hyper-parameters; 0 = none."},
    )
    train_per_class: int | None = field(default=None, metadata={"help": "Training examples per class (None = all)."})
    test_per_class: int | None = field(default=None, metadata={"help": "Test examples per class (None = all)."})
    max_length: int = field(default=64, metadata={"help": "Token limit for text backbones."})
    streaming: bool = field(
        default=False,
        metadata={"help": "Read `dataset` (a directory of train-*/test-*.parquet shards) as a stream, never loaded "
                          "into memory: hf_clroute.data.streaming (no per-class subsampling or validation split)."},
    )
    training: dict[str, Any] = field(default_factory=dict, metadata={"help": "TrainingConfig fields for every method."})
    methods: list[str] = field(
        default_factory=list,
        metadata={"help": "Methods `hf-clroute bench` runs by default (hf_clroute/bench/configs/methods/<name>.json)."},
    )
    quick: dict[str, Any] = field(default_factory=dict, metadata={"help": "Overrides of the fields above for --quick."})
    description: str = field(default="", metadata={"help": "What the suite measures, for tables and model cards."})
    method_settings: dict[str, dict[str, Any]] = field(
        default_factory=dict,
        metadata={"help": "Per-method {'config': ..., 'training': ...} for this suite; wins over the method files' "
                          "per-suite blocks (precedence: hf_clroute.bench.harness.settings)."},
    )
    probe_forgetting: bool = field(
        default=True, metadata={"help": "Fit the shallow/deep forgetting probes at every task end."}
    )
    bases: list[str] = field(
        default_factory=list,
        metadata={"help": "The suites this one is based on, nearest first (set from the file's 'base' chain)."},
    )
    reuse_picks_across_task_counts: bool = field(
        default=False,
        metadata={"help": "Run with a base suite's validation picks although this suite splits its classes into "
                          "another number of tasks (a task-count study: one setting, chosen on the base's validation "
                          "split, measured at several task counts). Off: a selection is reused only on the same "
                          "stream."},
    )
    allow_fewer_per_class: bool = field(
        default=False,
        metadata={"help": "When a class has fewer examples than train_per_class / test_per_class asks for: keep what "
                          "there is (true) instead of refusing the suite, which names the classes and their counts."},
    )

    #: the file the suite was read from (set by ``load``; None for a suite built in code), for messages
    source_file: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        check_field_types(type(self), dataclasses.asdict(self), f"suite {self.name!r}")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"SuiteConfig.scenario must be one of {SCENARIOS}, got {self.scenario!r}")
        if self.n_tasks <= 0:
            raise ValueError(f"SuiteConfig.n_tasks must be positive, got {self.n_tasks}")
        for name in ("train_per_class", "test_per_class"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"suite {self.name!r}: SuiteConfig.{name} must be an integer >= 1 or null (all), "
                                 f"got {getattr(self, name)!r}")
        known = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(self.quick) - known)
        if bad:
            raise ValueError(f"SuiteConfig.quick has unknown field(s) {bad}")
        if self.runner != "classification":
            raise ValueError(
                f"suite {self.name!r} has runner {self.runner!r}; SuiteConfig is for classification suites")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"suite {self.name!r}: SuiteConfig.test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.test_split == self.train_split:
            raise ValueError(f"suite {self.name!r}: SuiteConfig.test_split equals train_split ({self.train_split!r}); "
                             "set test_split to null to carve a test set from it")
        if self.image_size is not None and (isinstance(self.image_size, bool) or not isinstance(self.image_size, int)
                                            or self.image_size <= 0):
            raise ValueError(f"suite {self.name!r}: SuiteConfig.image_size must be a positive integer or null, "
                             f"got {self.image_size!r}")

    @classmethod
    def load(cls, name_or_path: str, quick: bool = False) -> "SuiteConfig":
        """A built-in suite name (``hf_clroute/bench/configs/suites/<name>.json``) or a path to a JSON file."""
        return load_suite(cls, name_or_path, quick)

    def quick_version(self) -> "SuiteConfig":
        quick = dataclasses.replace(self, **{**deep_merge(dataclasses.asdict(self), self.quick), "quick": {}})
        quick.source_file = self.source_file
        return quick

    def method_names(self) -> list[str]:
        return list(self.methods)


def drop_methods(methods: dict[str, Any], drop: tuple[str, ...]) -> None:
    """Remove ``drop`` from a results' ``methods`` (in place); an unknown name is an error."""
    unknown = sorted(set(drop) - set(methods))
    if unknown:
        raise ValueError(f"cannot drop {unknown}: not in these results (methods: {sorted(methods)})")
    for method in drop:
        del methods[method]


def load_suite(cls: type, name_or_path: str, quick: bool = False) -> Any:
    """Any runner's suite dataclass ``cls`` from a suite file; with ``quick``, the file's ``quick``
    block merged in key by key first (the one place ``--quick`` is applied)."""
    path, data, bases = read_suite_lineage(name_or_path)
    suite = suite_from_dict(cls, data, f"suite file {path}", quick=quick, bases=bases)
    if hasattr(cls, "source_file"):  # a class that declares it (a ClassVar): never a field another runner records
        suite.source_file = str(path)
    return suite


def suite_from_dict(cls: type, data: Any, where: str, quick: bool = False, bases: list[str] | None = None) -> Any:
    """``cls`` from a suite's fields (a file's, or inline in a run config), every field's type checked
    first: an error names ``where`` and the field, never a TypeError from deep inside a run."""
    if not isinstance(data, dict):
        raise UserInputError(f"{where} must hold a JSON object of suite fields, not a {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if isinstance(data.get("quick"), dict):
        unknown += sorted(f"quick.{k}" for k in set(data["quick"]) - set(fields))
    if unknown:
        raise UserInputError(f"{where} has unknown field(s) {unknown}; known: {sorted(fields)}")
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in data]
    if missing:
        raise UserInputError(f"{where} is missing required field(s) {missing} (e.g. \"dataset\": a source name, "
                             "a local path or a Hub dataset id)")
    check_field_types(cls, data, where)
    if isinstance(data.get("quick"), dict):
        check_field_types(cls, data["quick"], where, prefix="quick.")
    if quick:
        data = {**deep_merge(data, data.get("quick", {})), "quick": {}}
    if "bases" in fields and bases is not None:
        data["bases"] = bases
    try:
        return cls(**data)
    except (TypeError, ValueError) as err:
        raise UserInputError(f"{where}: {err}") from err


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's annotation (int is not bool, a float field takes an int)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    base = origin or hint
    return isinstance(value, base) if isinstance(base, type) else True


def _type_name(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
             dict: "an object"}
    return names.get(typing.get_origin(hint) or hint, str(hint))


def check_field_types(cls: type, data: dict[str, Any], where: str, prefix: str = "") -> None:
    """Refuse a suite field whose value has the wrong JSON type (``"n_tasks": "five"``); a ``training``
    block's values are checked against ``TrainingConfig`` (``hf_clroute.bench.harness.settings``)."""
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if name in hints and name != "quick" and not _type_ok(value, hints[name]):
            raise UserInputError(f"{where}: field {prefix}{name} must be {_type_name(hints[name])}, got {value!r}")
    if "training" in data and "training" in hints:
        check_training_block(data["training"], f"{where} ({prefix}training)" if prefix else where)


def read_suite_file(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """A suite file's fields (with its ``base`` chain merged in, see :func:`read_suite_lineage`)."""
    path, data, _ = read_suite_lineage(name_or_path)
    return path, data


def read_suite_lineage(name_or_path: str, _chain: tuple[str, ...] = ()) -> tuple[Path, dict[str, Any], list[str]]:
    """A suite file's fields and the names of the suites it is based on, nearest first.

    A file with ``"base": "<suite>"`` is that suite with its own fields on top (nested
    ``training`` and ``quick`` merged key by key), so a study such as "split-mnist at 20%
    of the data" is a three-line file, not a copy; it also gets the per-method settings
    its base suites get (method settings follow what a suite is, not what it is called)."""
    path = Path(name_or_path)
    if not path.is_file():
        path = CONFIG_ROOT / "suites" / f"{name_or_path}.json"
    if not path.is_file():
        raise UserInputError(f"unknown suite {name_or_path!r} (no such file, and not a built-in suite: "
                             f"{builtin_suites()})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"suite file {path} is not valid JSON: {err}") from err
    except UnicodeDecodeError as err:
        raise UserInputError(f"suite file {path} is not a text (JSON) file: {err}") from err
    if not isinstance(data, dict):
        raise UserInputError(f"suite file {path} must hold a JSON object of suite fields ({{\"name\": ..., "
                             f"\"dataset\": ..., ...}}), not a {type(data).__name__}")
    for block, where in ((data.get("training"), ""), ((data.get("quick") or {}).get("training"), " (quick.training)")):
        if block is not None and isinstance(data.get("quick", {}), dict):
            check_training_block(block, f"suite file {path}{where}")
    base = data.pop("base", None)
    if base is None:
        return path, data, []
    if not isinstance(base, str):
        raise UserInputError(f"suite file {path}: field base must be a suite name or file, got {base!r}")
    if base in _chain:
        raise UserInputError(f"suite file {path}: 'base' chain loops back to {base!r}")
    base_path, inherited, bases = read_suite_lineage(base, _chain + (base,))
    return path, deep_merge(inherited, data), [inherited.get("name", base_path.stem), *bases]


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` on top; nested dicts (``training``, ``quick``) merge key by key."""
    merged = dict(base)
    for key, value in changes.items():
        both_dicts = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = deep_merge(base[key], value) if both_dicts else value
    return merged


#: suite fields that do not change what a run measured: the default method list, the prose, the runner's name.
NOT_MEASURED = ("methods", "description", "runner")
#: config fields that hold one entry per method (APN's variants, a suite file's ``method_settings``): runs of
#: different methods join and the merged config holds every entry, but an entry must agree between two runs
#: that both hold it, or that both ran its method (an entry one of them lacks is then a difference)
PER_METHOD_CONFIG = ("apn_variants", "method_settings")
#: training values a suite may give as a default that each method overrides anyway: the learning rate is a
#: method file's, or the pick made on validation, and every row records the one it trained with
#: (``settings.training``), so a suite file that stopped giving a default rate still merges.
PER_METHOD_TRAINING = ("learning_rate",)


def same_suite_config(a: dict[str, Any], b: dict[str, Any], suite_class: type | None = None,
                      both_ran: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether two runs' recorded suite configs describe the same measurement: equal on every field
    but :data:`NOT_MEASURED`, a field missing from one (recorded before it existed) read as its
    default in ``suite_class``. ``both_ran``: the methods both runs hold rows of."""
    defaults = {} if suite_class is None else {
        f.name: (f.default if f.default is not dataclasses.MISSING else
                 f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        for f in dataclasses.fields(suite_class)}
    def measured(config: dict[str, Any], key: str) -> Any:
        value = config.get(key, defaults.get(key))
        if key == "training" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in PER_METHOD_TRAINING}
        return value

    def agree(key: str) -> bool:
        if key not in PER_METHOD_CONFIG:
            return measured(a, key) == measured(b, key)
        x, y = a.get(key) or {}, b.get(key) or {}
        return all(x.get(m) == y.get(m) for m in (set(x) & set(y)) | set(both_ran))

    return all(agree(k) for k in set(a) | set(b) if k not in NOT_MEASURED)


def joined_config(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The recorded suite config of several runs that :func:`same_suite_config` accepted: the last run's,
    with the per-method entries of every run."""
    joined = {key: {m: v for run in runs for m, v in (run["config"].get(key) or {}).items()}
              for key in PER_METHOD_CONFIG if any(run["config"].get(key) for run in runs)}
    return {**runs[-1]["config"], **joined}


def check_mergeable(runs: list[dict[str, Any]], suite_class: type | None = None) -> None:
    """Refuse to join runs of different suites, or of suite configs that measure differently."""
    for i, run in enumerate(runs):
        for earlier in runs[:i]:
            if run["suite"] != earlier["suite"] or not same_suite_config(
                    earlier["config"], run["config"], suite_class, set(earlier["methods"]) & set(run["methods"])):
                raise ValueError(f"cannot merge runs of different suites or suite configs "
                                 f"({earlier['suite']} vs {run['suite']})")


def merge_seed_runs(run_dirs: list[Path], out: Path, write_results: Callable[[dict, dict, Path], dict],
                    drop: tuple[str, ...] = (), seed_rows: tuple[str, ...] = ()) -> dict:
    """Join the per-seed rows of several runs of one runner suite and re-aggregate them.

    Runs must share the suite and its config (the stream is a function of suite and
    seed, so each invocation saw identical data); a later run's row replaces an
    earlier one for the same method and seed; methods in ``drop`` are left out. Header keys in
    ``seed_rows`` hold per-seed rows outside any method (a headroom study's frozen readouts): they
    are joined the same way, one row per seed.
    ``write_results(header, rows_by_method, out)`` is the runner's own aggregation and report.
    """
    results = [json.loads((Path(d) / "results.json").read_text()) for d in run_dirs]
    first = results[0]
    check_mergeable(results)
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    for run in results:
        for method, aggregate in run["methods"].items():
            for row in aggregate["per_seed"]:
                rows.setdefault(method, {})[row["seed"]] = row
    drop_methods(rows, drop)
    header = {
        "suite": first["suite"],
        "seeds": sorted({seed for by_seed in rows.values() for seed in by_seed}),
        "quick": first["quick"],
        "config": joined_config(results),
        "commands": [c for run in results for c in run.get("commands", [])],
    }
    for key in seed_rows:
        by_seed = {row["seed"]: row for run in results for row in run.get(key, [])}
        header[key] = [by_seed[s] for s in header["seeds"] if s in by_seed]
    return write_results(header, {m: [by_seed[s] for s in sorted(by_seed)] for m, by_seed in rows.items()}, Path(out))


def builtin_suites() -> list[str]:
    return sorted(p.stem for p in (CONFIG_ROOT / "suites").glob("*.json"))


def build_stream(suite: SuiteConfig, seed: int) -> list:
    """The suite's experiences for one seed (class order and stream order fixed by it)."""
    from hf_clroute.data.class_tasks import class_incremental
    from hf_clroute.data.labeled import load_labeled_dataset

    if suite.scenario == "domain":
        raise ValueError("domain-incremental suites take a list of datasets; not supported by SuiteConfig yet")
    if suite.streaming:
        from hf_clroute.data.streaming import streaming_suite_stream

        return streaming_suite_stream(suite, seed)
    dsets = load_labeled_dataset(resolve_dataset_path(suite.dataset), input_column=suite.input_column,
                                 label_column=suite.label_column, train_split=suite.train_split,
                                 test_split=suite.test_split, test_fraction=suite.test_fraction, seed=0)
    stream = class_incremental(
        dsets,
        n_tasks=suite.n_tasks,
        seed=seed,
        min_examples_per_class=suite.min_examples_per_class,
        max_classes=suite.max_classes,
        train_per_class=suite.train_per_class,
        test_per_class=suite.test_per_class,
        validation_per_class=suite.validation_per_class,
    )
    check_class_counts(suite, stream)
    for experience in stream:  # what an adapter's training history calls this stream
        experience.info["stream"] = f"{suite.name} (seed {seed})"
    return stream


def check_class_counts(suite: SuiteConfig, stream: list) -> None:
    """Refuse a stream where a class has fewer train/test examples than the suite asks for (the
    subsample would silently keep what there is), naming each short class and its count, unless
    the suite sets ``allow_fewer_per_class``."""
    from hf_clroute.data.labeled import column_array

    if suite.allow_fewer_per_class:
        return
    for split, wanted in (("train", suite.train_per_class), ("test", suite.test_per_class)):
        if wanted is None:
            continue
        counts: dict[str, int] = {}
        for experience in stream:
            data = getattr(experience, split)
            labels = column_array(data)
            names = getattr(data.features.get("label"), "names", None)
            for c in experience.classes:
                counts[names[c] if names and c < len(names) else str(c)] = int((labels == c).sum())
        short = {name: n for name, n in counts.items() if n < wanted}
        if short:
            listed = ", ".join(f"{name}: {n}" for name, n in sorted(short.items(), key=lambda kv: (kv[1], kv[0])))
            raise UserInputError(
                f"{suite_source(suite)}: {split}_per_class is {wanted}, but {len(short)} of {len(counts)} classes of "
                f"dataset {suite.dataset!r} have fewer {split} examples (class: count) {listed}; lower "
                f"{split}_per_class, or set \"allow_fewer_per_class\": true to keep what there is")


def resolve_dataset_path(dataset: str) -> str:
    """The suite's dataset string, with ``standin:<name>`` (an offline stand-in) resolved to its directory."""
    if dataset.startswith("standin:"):
        from hf_clroute.backbones.pretraining.standins import standin_path

        return standin_path(dataset)
    return dataset


def resolve_backbone_path(backbone: str) -> str:
    """Turn the suite's backbone string into something ``from_pretrained`` accepts."""
    if backbone.startswith("standin:"):
        from hf_clroute.backbones.pretraining.standins import standin_path

        return standin_path(backbone)
    if backbone.startswith("pretrained-vit:"):
        from hf_clroute.backbones.pretraining.vit import pretrained_vit_path

        return pretrained_vit_path(backbone.split(":", 1)[1])
    if backbone == "minilm":
        from hf_clroute.backbones.catalog import offline_model_path

        return offline_model_path("minilm")
    return backbone


def load_suite_backbone(suite: SuiteConfig) -> tuple[Any, Callable]:
    """(backbone model, collator) for the suite; loaded fresh for each method and seed."""
    from hf_clroute.backbones.catalog import get_backbone_spec, load_backbone
    from hf_clroute.data.collate import ImageCollator, TextClassificationCollator

    model, processor = load_backbone(resolve_backbone_path(suite.backbone))
    modality = get_backbone_spec(model).modality
    if modality == "image":
        collator = ImageCollator.from_processor(processor)
        if suite.image_size is not None:
            native = getattr(model.config, "image_size", None)
            if native is not None and native != suite.image_size:
                raise ValueError(f"suite {suite.name!r}: image_size {suite.image_size} but backbone "
                                 f"{suite.backbone!r} takes {native}x{native} images")
            collator.size = (suite.image_size, suite.image_size)
        return model, collator
    if modality == "text":
        return model, TextClassificationCollator(processor, max_length=suite.max_length)
    raise ValueError(f"suite {suite.name!r}: backbone modality {modality!r} is not a classification backbone")


# What makes two suites the same stream: a suite based on the tuned one that keeps these may reuse its
# picks (the same stream at 20% of its data); one that changes any of them is another stream.
STREAM_FIELDS = ("dataset", "backbone", "scenario", "n_tasks")


def load_selection(path: str | Path, suite: Any) -> dict[str, Any]:
    """``selection.json`` of ``suite``, or of a suite it is based on that draws the same stream
    (``STREAM_FIELDS``; e.g. the stream at 20% of its data reuses the full stream's picks, made on
    that stream's validation split; results.json copies the record, which names the suite tuned on), or
    of its base with another task count where the suite says so (``reuse_picks_across_task_counts``).
    Refused for any other suite."""
    selection = json.loads(Path(path).read_text())
    tuned_on = selection.get("suite")
    if tuned_on != suite.name:
        other_counts = getattr(suite, "reuse_picks_across_task_counts", False)
        fields = [f for f in STREAM_FIELDS if not (f == "n_tasks" and other_counts)]
        same_stream = tuned_on in (suite.bases or []) and all(
            read_suite_file(tuned_on)[1].get(name) == getattr(suite, name, None) for name in fields)
        if not same_stream:
            raise UserInputError(f"selection {path} was tuned on suite {tuned_on!r}, not {suite.name!r} (a suite "
                                 f"based on it may reuse it only with the same {', '.join(STREAM_FIELDS)})")
    methods = selection["methods"]  # picks saved before the one-separator rename keep their old names
    return {**{canonical_name(m): v for m, v in methods.items()}, **methods}
