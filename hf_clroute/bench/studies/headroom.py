"""The headroom test: can an adapter improve these backbones' features at all?

For one classification suite and seed, the union of every task's training data (the
suite's own stream for that seed, its validation split carved as for ``hf-clroute
tune``) is ONE joint task. Each adapter trains on it offline with a linear head, on the
engine (:class:`~hf_clroute.engine.ContinualTrainer` over a one-experience stream), its
epochs and learning rate chosen on the validation split from one grid shared by every
adapter, edge picks extended by the search rule of ``hf-clroute tune``; then it is frozen,
and the same readouts are fitted on its features and on the frozen backbone's features
(computed once per seed), every feature pass in eval mode:

* ``slda``: streaming LDA (``heads.lda``), its shrinkage chosen on validation;
* ``ranpac``: RanPAC's random projection + ridge (``heads.ranpac``), lambda in units of trace(G)/M
  chosen on validation;
* ``probe``: multinomial logistic regression run to convergence (L-BFGS), its L2 chosen on validation.

Each readout is fitted on the training data, its knob chosen on the validation split from
``hf-clroute tune``'s grid for that head (the probe: ``probe_weight_decays``) by the same search rule
(edge picks extend, a pick still on an edge is flagged), and scored on the suite's test split; the
test split never chooses anything. The
paired gain (adapted minus frozen, same seed, same readout) bounds what any continual
protocol could gain from the adapter on this suite: the adapter saw every class at once.

A headroom suite file names the classification suite, the adapters (method settings
files, e.g. ``lastblock`` for fine-tuning the last transformer block only, or
``adapter_settings`` entries: a method and config fields) and the grids.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from datasets import concatenate_datasets

from hf_clroute.bench.harness.feature_cache import (
    FeatureCollator,
    cache_stream_features,
)
from hf_clroute.bench.harness.grid_search import MAX_EXTENSIONS, flags, search
from hf_clroute.bench.harness.probes import PROBE_MAX_ITER, fit_logistic, model_features
from hf_clroute.bench.harness.results import markdown_table, write_run
from hf_clroute.bench.harness.settings import method_search, resolve_run
from hf_clroute.bench.harness.suites import (
    SuiteConfig,
    build_stream,
    load_suite,
    load_suite_backbone,
    merge_seed_runs,
)
from hf_clroute.bench.harness.verdicts import paired_cell
from hf_clroute.core.model import CLModel, get_cl_model
from hf_clroute.data.collate import decode_stream_if_small
from hf_clroute.data.experiences import Experience, validation_stream
from hf_clroute.engine import ContinualTrainer, make_accelerator
from hf_clroute.heads import RandomProjectionRidgeHead, StreamingLDAHead
from hf_clroute.metrics import mean_std
from hf_clroute.metrics.aggregate import format_mean_std, paired_difference

READOUTS = ("slda", "ranpac", "probe")
#: each readout's knob (the search axis), and the head whose ``hf-clroute tune`` grid it searches
KNOBS = {"slda": ("shrinkage", "slda", "config.head_options.shrinkage"),
         "ranpac": ("ridge_lambda", "ranpac", "config.head_options.ridge_lambda"),
         "probe": ("weight_decay", None, None)}


def tune_grid(readout: str) -> list[float]:
    """The grid ``hf-clroute tune`` searches for ``readout``'s head (its settings file's ``"search"``)."""
    _, method, key = KNOBS[readout]
    return [float(v) for v in method_search(method)[key]]


@dataclass
class HeadroomSuite:
    """A headroom suite file's fields (``configs/suites/headroom-<suite>.json``)."""

    name: str = field(metadata={"help": "Study name, used in results."})
    runner: str = field(metadata={"help": "This runner: 'headroom'."})
    suite: str = field(metadata={"help": "The classification suite whose stream (all tasks joined) is studied."})
    adapters: list[str] = field(
        metadata={"help": "Adapters run by default: method settings names or keys of adapter_settings."})
    adapter_settings: dict[str, dict[str, Any]] = field(
        default_factory=dict,
        metadata={"help": "Adapter name -> {'method': settings file or registered method, 'config': adapter config "
                          "fields on top of the method's}."},
    )
    epochs: list[int] = field(default_factory=lambda: [1, 3, 5],
                              metadata={"help": "Epoch grid over the joint task (same for every adapter)."})
    learning_rates: list[float] = field(default_factory=lambda: [1e-4, 1e-3, 1e-2],
                                        metadata={"help": "Learning-rate grid (same for every adapter)."})
    slda_shrinkage: list[float] = field(
        default_factory=lambda: tune_grid("slda"),
        metadata={"help": "Streaming-LDA shrinkages, one chosen on validation (edge picks extend); default: "
                          "hf-clroute tune's grid for slda."})
    ranpac_lambdas: list[float] = field(
        default_factory=lambda: tune_grid("ranpac"),
        metadata={"help": "RanPAC ridge lambdas in units of trace(G)/M (lambda_mode 'relative'), one chosen on "
                          "validation (edge picks extend); default: hf-clroute tune's grid for ranpac."})
    ranpac_projection_dim: int = field(default=2048, metadata={"help": "RanPAC's random projection width M."})
    max_extensions: int = field(default=MAX_EXTENSIONS, metadata={"help": "Runs an edge pick (an adapter's or a "
                                                                   "readout's) may add past the grid's edges (the "
                                                                   "search rule of hf-clroute tune)."})
    probe_weight_decays: list[float] = field(
        default_factory=lambda: [1e-5, 1e-4, 1e-3],
        metadata={"help": "L2 penalties of the logistic probe, one chosen on validation (edge picks extend)."})
    quick: dict[str, Any] = field(default_factory=dict, metadata={"help": "Overrides of the fields above for --quick."})
    description: str = field(default="", metadata={"help": "What the study measures."})

    def __post_init__(self) -> None:
        if self.runner != "headroom":
            raise ValueError(f"suite {self.name!r} has runner {self.runner!r}; HeadroomSuite is for runner 'headroom'")
        if not self.adapters:
            raise ValueError(f"suite {self.name!r}: HeadroomSuite.adapters is empty")
        for name in ("epochs", "learning_rates", "slda_shrinkage", "ranpac_lambdas", "probe_weight_decays"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in values):
                raise ValueError(f"suite {self.name!r}: HeadroomSuite.{name} must be a non-empty list of positive "
                                 f"numbers, got {values!r}")
        if isinstance(self.max_extensions, bool) or not isinstance(self.max_extensions, int) or self.max_extensions < 0:
            raise ValueError(f"suite {self.name!r}: HeadroomSuite.max_extensions must be an integer >= 0, got "
                             f"{self.max_extensions!r}")
        if any(not isinstance(e, int) for e in self.epochs):
            raise ValueError(f"suite {self.name!r}: HeadroomSuite.epochs must be integers, got {self.epochs!r}")
        unknown = sorted(set(self.adapter_settings) - set(self.adapters))
        if unknown:  # a typo there would silently run the method file of the same name instead
            raise ValueError(f"suite {self.name!r}: adapter_settings names {unknown}, which are not in adapters")
        for adapter, spec in self.adapter_settings.items():
            bad = sorted(set(spec) - {"method", "config"})
            if bad:
                raise ValueError(f"suite {self.name!r}: adapter_settings.{adapter} has unknown key(s) {bad}; "
                                 "known: method, config")

    @classmethod
    def load(cls, name_or_path: str, quick: bool = False) -> "HeadroomSuite":
        return load_suite(cls, name_or_path, quick)

    def adapter(self, name: str) -> dict[str, Any]:
        """``{"method", "config"}`` of adapter ``name``."""
        spec = self.adapter_settings.get(name, {})
        return {"method": spec.get("method", name), "config": dict(spec.get("config", {}))}


# ------------------------------------------------------------------ data


def joint_experience(stream: list[Experience], seed: int) -> Experience:
    """Every task of ``stream`` as one experience: training data shuffled together (seeded),
    test and validation splits joined; labels keep the stream's incremental ids."""
    train = concatenate_datasets([e.train for e in stream]).shuffle(seed=seed).flatten_indices()
    validation = None
    if all(e.validation is not None for e in stream):
        validation = concatenate_datasets([e.validation for e in stream])
    name = stream[0].name.rsplit("/", 1)[0] if "/" in stream[0].name else stream[0].name
    info = {k: v for k, v in stream[0].info.items() if k not in ("class_names", "original_classes")}
    for key in ("class_names", "original_classes"):  # per-class lists, aligned with ``classes``
        if all(key in e.info for e in stream):
            info[key] = [v for e in stream for v in e.info[key]]
    return Experience(0, f"{name}/joint", [c for e in stream for c in e.classes], train,
                      concatenate_datasets([e.test for e in stream]), info=info, validation=validation)


@torch.no_grad()
def feature_splits(model: CLModel, experience: Experience,
                   collator: Callable) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(features, labels) of the train, validation and test splits as ``model``'s classifier reads
    them, every pass in eval mode (``model_features`` switches the whole model, backbone included)."""
    return {split: model_features(model, data, collator) for split, data in experience.splits().items()}


def cached_splits(experience: Experience) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The same, read from an experience of cached frozen features (``feature_cache``)."""
    return {split: (torch.as_tensor(np.asarray(data["features"])).float(),
                    torch.as_tensor(np.asarray(data["label"])).long())
            for split, data in experience.splits().items()}


# ------------------------------------------------------------------ readouts


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return (logits.argmax(1) == labels).double().mean().item()


def _choose(readout: str, grid: list[float], score: Callable[[float], float], max_extensions: int,
            valid: Callable[[float], bool] = lambda v: v > 0) -> dict[str, Any]:
    """``readout``'s knob chosen on validation by the search rule of ``hf-clroute tune`` (``grid_search``)."""
    axis = KNOBS[readout][0]
    found = search([{axis: v} for v in grid], lambda p: score(p[axis]), lambda p: valid(p[axis]), max_extensions)
    tried = grid + [e["point"][axis] for e in found["extensions"]]
    scores = found["validation_A_T"] + [e["validation_A_T"] for e in found["extensions"]]
    return {"pick": found["pick_point"], "validation": found["pick_validation_A_T"], "edge": found["edge"],
            "edge_axes": found["edge_axes"], "tried": [{axis: v, "validation": a} for v, a in zip(tried, scores)]}


def slda_readout(splits: dict, shrinkages: list[float], max_extensions: int = MAX_EXTENSIONS) -> dict[str, Any]:
    """Streaming LDA fitted on train, shrinkage chosen on validation, scored on test."""
    (x, y), num_classes = splits["train"], int(splits["train"][1].max()) + 1
    head = StreamingLDAHead(x.shape[1], shrinkage=shrinkages[0], num_classes=num_classes)
    head.accumulate(x, y)
    head.sync()
    x_val, y_val = splits["validation"]

    def score(shrinkage: float) -> float:
        head.set_shrinkage(shrinkage)
        return _accuracy(head(x_val.double()), y_val)

    chosen = _choose("slda", shrinkages, score, max_extensions, valid=lambda v: 0 < v <= 1)
    head.set_shrinkage(chosen["pick"]["shrinkage"])
    return {"test": _accuracy(head(splits["test"][0].double()), splits["test"][1]), **chosen}


def ranpac_readout(splits: dict, lambdas: list[float], projection_dim: int, seed: int,
                   max_extensions: int = MAX_EXTENSIONS) -> dict[str, Any]:
    """RanPAC's projection + ridge fitted on train, lambda (in units of trace(G)/M) chosen on validation,
    scored on test."""
    (x, y), num_classes = splits["train"], int(splits["train"][1].max()) + 1
    head = RandomProjectionRidgeHead(x.shape[1], projection_dim=projection_dim, seed=seed, num_classes=num_classes,
                                     lambda_mode="relative")
    head.accumulate(x, y)
    head.sync()
    accuracy_at, unit = head.lambda_scorer(*splits["validation"]), head.mean_eigenvalue()
    chosen = _choose("ranpac", lambdas, lambda relative: accuracy_at(relative * unit), max_extensions)
    head.set_ridge_lambda(chosen["pick"]["ridge_lambda"])
    return {"test": _accuracy(head(splits["test"][0].double()), splits["test"][1]), **chosen}


def probe_readout(splits: dict, weight_decays: list[float], max_extensions: int = MAX_EXTENSIONS) -> dict[str, Any]:
    """The logistic probe (run to convergence) fitted on train, its L2 chosen on validation, scored on test."""
    fitted: dict[float, Callable] = {}

    def fit(weight_decay: float) -> Callable:
        if weight_decay not in fitted:
            fitted[weight_decay] = fit_logistic(*splits["train"], weight_decay, max_iter=PROBE_MAX_ITER)
        return fitted[weight_decay]

    def score(weight_decay: float) -> float:
        x_val, y_val = splits["validation"]
        return (fit(weight_decay)(x_val) == y_val).double().mean().item()

    chosen = _choose("probe", weight_decays, score, max_extensions)
    x_test, y_test = splits["test"]
    return {"test": (fit(chosen["pick"]["weight_decay"])(x_test) == y_test).double().mean().item(), **chosen}


def readouts(suite: HeadroomSuite, splits: dict, seed: int) -> dict[str, dict[str, Any]]:
    """Every readout's test accuracy, validation score and pick on one set of features."""
    return {
        "slda": slda_readout(splits, suite.slda_shrinkage, suite.max_extensions),
        "ranpac": ranpac_readout(splits, suite.ranpac_lambdas, suite.ranpac_projection_dim, seed, suite.max_extensions),
        "probe": probe_readout(splits, suite.probe_weight_decays, suite.max_extensions),
    }


# ------------------------------------------------------------------ adapters


def build_adapter(headroom: HeadroomSuite, suite: SuiteConfig, name: str, seed: int, learning_rate: float,
                  epochs: int) -> tuple[CLModel, Any]:
    """A fresh adapter ``name`` on a freshly loaded backbone, and its training config."""
    spec = headroom.adapter(name)
    overrides = {"learning_rate": learning_rate, "epochs": epochs, "evals_per_task": epochs, "eval_every": 0}
    settings = resolve_run(suite, spec["method"], seed, overrides, spec["config"])
    backbone, _ = load_suite_backbone(suite)
    settings.adapter_config.base_model_name_or_path = suite.backbone
    return get_cl_model(backbone, settings.adapter_config), settings.training


def adapt(headroom: HeadroomSuite, suite: SuiteConfig, name: str, seed: int, joint: Experience, collator: Callable,
          progress: bool = False) -> tuple[CLModel, dict[str, Any]]:
    """Train adapter ``name`` with a linear head on the joint task, choose its learning rate and epochs on
    validation by the shared search rule (``grid_search.search``: the suite's grid, then edge picks
    extended up to ``max_extensions`` runs), and return the picked model frozen.

    A run at one learning rate is scored on validation after every epoch (the engine's anytime
    evaluations, ``evals_per_task = epochs``), so the shorter points at that rate are read off it; a
    point with more epochs than any run so far trains that rate again for them, and a pick with fewer
    epochs than its rate's last run is trained again for exactly that many (same seed, same data order)."""
    scoring = validation_stream([joint])
    # learning rate -> (its last model, validation after each epoch)
    runs: dict[float, tuple[CLModel, list[float]]] = {}

    def train(lr: float, epochs: int) -> None:
        model, training = build_adapter(headroom, suite, name, seed, lr, epochs)
        result = ContinualTrainer(model, scoring, dataclasses.replace(training, progress=progress), collator,
                                  make_accelerator(training), run_info={"suite": suite.name, "headroom": name}).fit()
        after_epoch = [accuracy for _, accuracy in result.anytime]  # entry e-1: after epoch e
        if len(after_epoch) != epochs:
            raise ValueError(f"adapter {name!r}: {len(after_epoch)} validation scores for {epochs} epochs; the "
                             "joint task needs at least one training batch per epoch")
        runs[lr] = (model, after_epoch)

    def score(point: dict[str, Any]) -> float:
        lr, epochs = point["learning_rate"], point["epochs"]
        if len(runs.get(lr, (None, []))[1]) < epochs:
            train(lr, max(epochs, *headroom.epochs))
        return runs[lr][1][epochs - 1]

    grid = [{"learning_rate": lr, "epochs": e} for lr in headroom.learning_rates for e in headroom.epochs]
    found = search(grid, score, valid=lambda p: p["epochs"] >= 1, max_extensions=headroom.max_extensions)
    pick = found["pick_point"]
    if len(runs[pick["learning_rate"]][1]) != pick["epochs"]:
        train(pick["learning_rate"], pick["epochs"])
    model = runs[pick["learning_rate"]][0]
    trained = int(model.parameter_counts()["trainable_params"])  # counted before the freeze below
    model.requires_grad_(False)  # the adapter is a fixed feature extractor from here on
    model.eval()
    tried = grid + [e["point"] for e in found["extensions"]]
    scores = found["validation_A_T"] + [e["validation_A_T"] for e in found["extensions"]]
    record = {"grid": [{**p, "validation": v} for p, v in zip(tried, scores)], "pick": pick,
              "validation": found["pick_validation_A_T"], "extensions": found["extensions"], "edge": found["edge"],
              "edge_axes": found["edge_axes"], "inert_axes": found["inert_axes"], "trainable_params": trained}
    return model, record


def run_adapter(headroom: HeadroomSuite, suite: SuiteConfig, name: str, seed: int, joint: Experience,
                cached: Experience, collator: Callable, frozen: dict, progress: bool = False) -> dict[str, Any]:
    """One (adapter, seed) row: the grid, the pick, and every readout on adapted vs frozen features."""
    started = time.perf_counter()
    # MaRS's memory reads only the frozen pooled features: it trains and is read on the cached ones.
    on_cache = build_adapter(headroom, suite, name, seed, headroom.learning_rates[0], 1)[0].reads_frozen_features()
    experience, batches = (cached, FeatureCollator()) if on_cache else (joint, collator)
    model, record = adapt(headroom, suite, name, seed, experience, batches, progress)
    splits = feature_splits(model, experience, batches)
    own_head = _accuracy(model.head(splits["test"][0]), splits["test"][1]) if model.head is not None else None
    adapted = readouts(headroom, splits, seed)
    rows = {r: {"frozen": frozen[r]["test"], "adapted": adapted[r]["test"],
                "gain": adapted[r]["test"] - frozen[r]["test"], "pick": adapted[r]["pick"],
                "frozen_pick": frozen[r]["pick"], "validation": adapted[r]["validation"],
                "frozen_validation": frozen[r]["validation"], "edge": adapted[r]["edge"],
                "frozen_edge": frozen[r]["edge"]} for r in READOUTS}
    return {"seed": seed, **record, "selection": selection_rule(headroom), "features_cached": on_cache,
            "own_head_test": own_head, "readouts": rows, "wall_s": time.perf_counter() - started}


def selection_rule(headroom: HeadroomSuite) -> dict[str, Any]:
    """Where a per-seed row's picks were chosen, the same for every seed of a study (``results.check_picks``):
    each seed chooses its adapter's epochs and learning rate, and each readout's knob, on its own validation
    split from these grids by the search rule of ``hf-clroute tune``."""
    return {"chosen_on": "the validation split of the row's seed", "rule": "grid_search (edge picks extend)",
            "max_extensions": headroom.max_extensions, "epochs": headroom.epochs,
            "learning_rates": headroom.learning_rates, "slda_shrinkage": headroom.slda_shrinkage,
            "ranpac_lambdas": headroom.ranpac_lambdas, "ranpac_lambda_units": "trace(G)/M",
            "probe_weight_decays": headroom.probe_weight_decays}


# ------------------------------------------------------------------ runner


def run(name_or_path: str, *, methods: list[str] | None, seeds: list[int], quick: bool, out: str | Path,
        progress: bool = False) -> dict:
    """``hf-clroute bench --suite headroom-<suite>``: writes ``out/results.json`` and ``out/results.md``."""
    headroom = HeadroomSuite.load(name_or_path, quick=quick)
    suite = SuiteConfig.load(headroom.suite, quick=quick)
    if not suite.validation_per_class:
        raise ValueError(f"suite {headroom.name!r}: classification suite {suite.name!r} has no validation split "
                         "(validation_per_class), on which the adapters' epochs and rates are chosen")
    adapters = list(methods or headroom.adapters)
    for name in adapters:  # every adapter resolves before anything trains
        adapter = headroom.adapter(name)
        resolve_run(suite, adapter["method"], seeds[0], config_overrides=adapter["config"])
    runs: dict[str, list[dict]] = {a: [] for a in adapters}
    frozen_rows = []
    for seed in seeds:
        started = time.perf_counter()
        backbone, collator = load_suite_backbone(suite)
        joint = decode_stream_if_small([joint_experience(build_stream(suite, seed), seed)], collator)[0]
        cached = cache_stream_features(backbone, [joint], collator)[0][0]  # frozen features, once per seed
        frozen = readouts(headroom, cached_splits(cached), seed)
        frozen_rows.append({"seed": seed, **{r: frozen[r] for r in READOUTS}, "wall_s": time.perf_counter() - started})
        print(f"[{headroom.name}] seed {seed} frozen: " + ", ".join(f"{r} {frozen[r]['test']:.3f}" for r in READOUTS),
              flush=True)
        for name in adapters:
            row = run_adapter(headroom, suite, name, seed, joint, cached, collator, frozen, progress)
            runs[name].append(row)
            print(f"[{headroom.name}] seed {seed} {name} (lr {row['pick']['learning_rate']:g}, {row['pick']['epochs']} "
                  "ep): " + ", ".join(f"{r} {row['readouts'][r]['adapted']:.3f} ({row['readouts'][r]['gain']:+.3f})"
                                      for r in READOUTS) + f" ({row['wall_s']:.0f}s)", flush=True)
    config = {k: v for k, v in dataclasses.asdict(headroom).items() if k != "quick"}
    config["classification_suite"] = {k: v for k, v in dataclasses.asdict(suite).items() if k != "quick"}
    header = {"suite": headroom.name, "seeds": seeds, "quick": quick, "config": config, "frozen": frozen_rows}
    return write_results(header, runs, Path(out))


def paired_gain(rows: list[dict], readout: str) -> dict | None:
    """Adapted − frozen accuracy of ``readout``, paired by seed (``paired_difference``: the verdicts' test)."""
    return paired_difference({r["seed"]: r["readouts"][readout]["adapted"] for r in rows},
                             {r["seed"]: r["readouts"][readout]["frozen"] for r in rows})


def strongest_readout(results: dict) -> str | None:
    """The readout with the best mean validation accuracy on the frozen features (``results["frozen"]``);
    None where a seed's readout recorded no validation score (a study written before it was recorded)."""
    frozen = results.get("frozen") or []
    scores = {r: [row.get(r, {}).get("validation") for row in frozen] for r in READOUTS}
    if not frozen or any(v is None for values in scores.values() for v in values):
        return None
    return max(READOUTS, key=lambda r: (sum(scores[r]) / len(scores[r]), -READOUTS.index(r)))


def mean_of(results: dict, readout: str, key: str = "test") -> float:
    """The frozen features' ``readout`` accuracy, mean over the study's seeds."""
    values = [row[readout][key] for row in results["frozen"]]
    return sum(values) / len(values)


def readout_edge_mark(results: dict, adapter: str, readout: str) -> str:
    """"†" where ``readout``'s pick is still on an edge of its grid, on the adapted or the frozen features."""
    rows = results["methods"][adapter]["per_seed"]
    return "†" if any(r["readouts"][readout].get(k) for r in rows for k in ("edge", "frozen_edge")) else ""


def adapter_edge(row: dict) -> bool:
    """Whether an adapter's pick (one seed's row) is flagged by today's search rule, judged from the points it
    recorded (:func:`~hf_clroute.bench.harness.grid_search.flags`); a row without them keeps its recorded flag."""
    if not row.get("grid"):
        return bool(row.get("edge"))
    tried = [{k: v for k, v in p.items() if k != "validation"} for p in row["grid"]]
    return flags(tried, row["pick"], inert=row.get("inert_axes", ()))["edge"]


def aggregate_adapter(rows: list[dict]) -> dict[str, Any]:
    rows = sorted(rows, key=lambda r: r["seed"])
    summary = {r: {k: mean_std([row["readouts"][r][k] for row in rows]) for k in ("frozen", "adapted", "gain")}
               for r in READOUTS}
    return {"readouts": summary, "gain_test": {r: paired_gain(rows, r) for r in READOUTS},
            "own_head_test": mean_std([r["own_head_test"] for r in rows]),
            "wall_s": mean_std([r["wall_s"] for r in rows]), "per_seed": rows}


def write_results(header: dict, runs: dict[str, list[dict]], out: Path) -> dict:
    """Aggregate per-seed rows into ``out/results.json`` and ``out/results.md``."""
    results = {**header, "kind": "headroom", "methods": {a: aggregate_adapter(r) for a, r in runs.items()}}
    results["strongest_readout"] = strongest_readout(results)
    return write_run(out, results, results_markdown(results))


def _pct(stat: dict[str, float] | None, one_seed: bool) -> str:
    return format_mean_std(stat, n=1 if one_seed else None)


def _knob(row: dict, readout: str) -> str:
    value = (row["readouts"][readout].get("pick") or {}).get(KNOBS[readout][0])
    return "n/a" if value is None else f"{value:g}"


def results_markdown(results: dict) -> str:
    seeds = ", ".join(map(str, results["seeds"]))
    strongest = results.get("strongest_readout")
    lines = [f"# {results['suite']} (seeds {seeds})", "",
             f"Each adapter trained offline with a linear head on all of {results['config']['suite']}'s training "
             "classes at once (epochs and learning rate chosen on validation), then frozen; the same readouts "
             "fitted on its features and on the frozen backbone's, each readout's knob (shrinkage, lambda in units "
             "of trace(G)/M, L2) chosen on validation. Test accuracy in %, mean ± std over seeds; gain = adapted − "
             "frozen, paired by seed (the paired t test of the verdicts: better/worse at p < 0.05 with at least 5 "
             "seeds; per-seed gains in their own column). † : a pick still on the edge of its grid after extension "
             "(the adapter's, or the readout's on the adapted or frozen features). * : the readout strongest on the "
             "frozen features by validation accuracy" + ("" if strongest else " (n/a: not every readout recorded a "
                                                          "validation score)") + ".", ""]
    rows = []
    for name, m in results["methods"].items():
        one_seed = len(m["per_seed"]) == 1  # per adapter: a merged study may hold more seeds of another adapter
        picks = ", ".join(f"{r['pick']['learning_rate']:g}/{r['pick']['epochs']}{'†' if adapter_edge(r) else ''}"
                          for r in m["per_seed"])
        for readout in READOUTS:
            s = m["readouts"][readout]
            gains = ", ".join(f"{r['readouts'][readout]['gain'] * 100:+.1f}" for r in m["per_seed"])
            knobs = ", ".join(_knob(r, readout) for r in m["per_seed"])
            rows.append([name, f"{readout}{' *' if readout == strongest else ''}", _pct(s["frozen"], one_seed),
                         _pct(s["adapted"], one_seed), paired_cell(paired_gain(m["per_seed"], readout)), gains,
                         f"{knobs}{readout_edge_mark(results, name, readout)}", _pct(m["own_head_test"], one_seed),
                         picks])
    header = ["adapter", "readout", "frozen", "adapted", "gain (paired)", "gain per seed", "readout pick (adapted)",
              "own linear head", "pick (lr/epochs)"]
    return "\n".join(lines) + "\n" + markdown_table(header, rows)


def merge(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = ()) -> dict:
    """Join headroom runs of one study (one per seed, or per adapter of a seed) and re-aggregate them,
    keeping one frozen-readout row per seed (runs of one seed read the same frozen features)."""
    return merge_seed_runs(run_dirs, out, write_results, drop, seed_rows=("frozen",))
