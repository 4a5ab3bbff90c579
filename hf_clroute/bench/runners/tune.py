"""`hf-clroute tune`: choose each method's hyper-parameters on the validation split, never on test.

One search rule for every method, applied by the search itself, so no method wins by a larger search:

* **The same budget.** Every method runs exactly ``BUDGET`` (12) configurations before extension. A gradient-trained
  method searches the learning rates ``LEARNING_RATES`` times exactly ``BUDGET / len(LEARNING_RATES)`` (4) points of
  at most ``MAX_KNOBS`` (2) knobs of its own (``"search"`` in its settings file); one with no knob of its own
  searches the weight decays ``WEIGHT_DECAYS``. A method with nothing to train searches 12 points of its own knobs;
  one with no knob at all (NCM) has one configuration.
* **One search rule** (:mod:`hf_clroute.bench.harness.grid_search`): the search starts at the grid's centre; a point
  replaces the pick only when it beats it by at least one binomial standard error of validation accuracy
  (``sqrt(p(1-p)/N)``, N the validation examples); an edge pick extends its axis one geometric step, a pick whose
  neighbour never ran at its other values runs it (a *check*), up to ``MAX_EXTENSIONS`` runs, the same limit for
  every method and suite, with no resume needed; an axis that scores the same at every value is ``inert`` and the
  grid runs it wasted go to the other axes. The record says all of it: ``search_rule``, ``move_threshold``,
  ``moves``, ``inert_axes``, ``effective_budget`` (distinct effective configurations evaluated). A pick still on
  an edge after that is flagged (``"edge": true``); the tables mark it. ``--resume`` reads a recorded search's
  scores instead of running them again (its extensions stand and count towards the limit).

``"search"`` is either axes whose product gives the points (``{"config.k": [1, 5]}``) or explicit points
(``{"points": [{"config.a": 1, "config.b": "x"}, ...]}``); a dict value (``"config.head_options": [{...}]``) or a
dotted key (``"config.head_options.shrinkage"``) sets fields inside a dict field, over the method's own value for
the suite. Each configuration runs the suite's stream with every test split replaced by the validation split carved
from the training data (``validation_per_class``), one seed (``seed``, default 0). ``selection.json`` records the
grid, every score, every extension and the pick; ``hf-clroute bench --selection`` trains with the picks and copies
the record into results.json. Epochs share a run where they can (:func:`epoch_siblings`), and a stopped search
loses nothing (:class:`SearchProgress`).
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

from hf_clroute.backbones.precision import setting_from
from hf_clroute.bench.harness.feature_cache import (
    FeatureCollator,
    cache_stream_features,
)
from hf_clroute.bench.harness.grid_search import MAX_EXTENSIONS, SE_MULTIPLE, TOLERANCE, Point, search
from hf_clroute.bench.harness.settings import method_search, resolve_run
from hf_clroute.bench.harness.suites import (
    SuiteConfig,
    build_stream,
    load_suite_backbone,
)
from hf_clroute.bench.runners.classification import run_method, summarize_result
from hf_clroute.core.model import get_cl_model
from hf_clroute.core.registry import method_key
from hf_clroute.data.collate import decode_stream_if_small
from hf_clroute.data.experiences import validation_stream
from hf_clroute.hub.io import atomic_write_text

# The committed picks of the earlier 1e-4 .. 1e-2 grid sat at both ends: full-backbone methods at
# 1e-4, frozen-backbone heads at 1e-2 (or 3e-3). Centred on 1e-3, both ends are one extension step
# past this grid's edges, and three steps reach 3e-5 and 3e-2.
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
BUDGET = 12
MAX_KNOBS = 2
# AdamW's decoupled decay, from negligible to strong over a task's few hundred steps.
WEIGHT_DECAYS = (1e-3, 1e-2, 1e-1, 1.0)



def _flat(point: Point, method: str) -> Point:
    """``{"config.head_options": {"k": v}}`` -> ``{"config.head_options.k": v}``; keys are checked."""
    flat: Point = {}
    for key, value in point.items():
        if key.partition(".")[0] not in ("config", "training") or not key.partition(".")[2]:
            raise ValueError(f"method {method!r}: search key {key!r} must be 'config.<field>' or 'training.<field>'")
        if isinstance(value, dict):
            flat |= {f"{key}.{name}": inner for name, inner in value.items()}
        else:
            flat[key] = value
    return flat


def own_points(method: str, trains: bool) -> list[Point]:
    """The method's own points (flat, dotted keys): its ``"search"``, or the weight decays."""
    search = method_search(method)
    if "points" in search:
        if len(search) > 1:
            raise ValueError(f"method {method!r}: 'search' gives either 'points' or axes, not both "
                             f"(has {sorted(search)})")
        points = [_flat(p, method) for p in search["points"]]
    else:
        points = [_flat(dict(zip(search, values)), method) for values in itertools.product(*search.values())]
    if points == [{}] and trains:
        points = [{"training.weight_decay": wd} for wd in WEIGHT_DECAYS]
    knobs = sorted({k for p in points for k in p if len({repr(q.get(k)) for q in points}) > 1})
    if len(knobs) > MAX_KNOBS:
        raise ValueError(f"method {method!r} searches {knobs}: at most {MAX_KNOBS} knobs of its own")
    if trains and any("training.learning_rate" in p for p in points):
        raise ValueError(f"method {method!r}: the learning rate is searched for every method "
                         f"({list(LEARNING_RATES)}); leave it out of 'search'")
    return points


def search_grid(method: str, trains: bool) -> list[Point]:
    """The ``BUDGET`` configurations ``method`` is tried with before extension, as flat points
    (``{"training.x" | "config.x" | "config.x.y": value}``); ``[{}]`` for a method with nothing to choose."""
    points = own_points(method, trains)
    grid = [{"training.learning_rate": lr, **p} for lr in LEARNING_RATES for p in points] if trains else points
    if grid != [{}] and len(grid) != BUDGET:
        per_rate = BUDGET // len(LEARNING_RATES)
        rule = (f"{len(LEARNING_RATES)} learning rates x exactly {per_rate} points of its own"
                if trains else f"exactly {BUDGET} points of its knobs (it trains nothing)")
        raise ValueError(f"method {method!r}: {len(grid)} configurations ({len(points)} points of its own), but "
                         f"every method gets exactly {BUDGET}: {rule}. Fix 'search' in its settings file")
    return grid


def selected(point: Point, config: Any) -> dict[str, Any]:
    """A flat point as the resolver's ``selected`` layer: a dotted key ``config.f.k`` sets ``k``
    inside field ``f``, over ``config.f`` (the method's resolved value for the suite)."""
    out: dict[str, Any] = {}
    for key, value in point.items():
        part, _, name = key.partition(".")
        field, dot, inner = name.partition(".")
        if not dot:
            out[key] = value
        elif part != "config":
            raise ValueError(f"search key {key!r}: only config fields hold nested values")
        else:
            base = out.get(f"config.{field}", dict(getattr(config, field, None) or {}))
            out[f"config.{field}"] = {**base, inner: value}
    return out


def _key(point: Point) -> str:
    return json.dumps(point, sort_keys=True)


EPOCHS = "training.epochs"


def epoch_siblings(point: Point, grid: list[Point], done: dict[str, float]) -> list[int]:
    """The epochs, ascending, of ``point`` and of the grid points that differ from it only in
    ``training.epochs`` and have no score yet (``done``, by point); [] when ``point`` sets no epochs.

    Epochs share a run where they can. A method whose e-epoch run is exactly the first e epochs
    of its E-epoch run (``ContinualMethod.epochs_share_prefix``: joint training's final form, which
    trains once on one stream read E times in the same order) scores the grid points that differ only
    in ``training.epochs`` from one run at the largest of them, evaluated on validation at each smaller
    epoch count's last step (an anytime evaluation), when every epoch ends on a whole batch. The scores
    are those of separate runs (up to float summation order; tests/test_tune.py), at the cost of the
    longest one; ``"shared_epochs"`` in the record lists those runs.
    """
    if EPOCHS not in point:
        return []
    rest = {k: v for k, v in point.items() if k != EPOCHS}
    return sorted({point[EPOCHS]} | {p[EPOCHS] for p in grid if EPOCHS in p and _key(p) not in done
                                     and {k: v for k, v in p.items() if k != EPOCHS} == rest})


def recorded_search(resume: Path, suite: str, method: str, grid: list[Point], seed: int,
                    precision: str, explicit: bool) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The validation A_T of every point an earlier search of ``method`` ran (``resume``: its selection.json),
    by point, and the extensions it recorded (the resumed search starts from them). Only the same search can be
    resumed: the same suite, seed, grid and precision setting. A record made before tune recorded its setting is
    resumed only with one given explicitly
    (``explicit``: ``--precision``), the one its runs used; its bench rows' results.json say which."""
    previous = json.loads(Path(resume).read_text())
    picks = previous.get("methods", {})
    record = picks.get(method_key(picks, method) or method)
    where = f"--resume {resume}"
    if previous.get("suite") != suite:
        raise ValueError(f"{where}: tuned on suite {previous.get('suite')!r}, not {suite!r}")
    if record is None:
        raise ValueError(f"{where}: no search of method {method!r} to resume "
                         f"(it has {sorted(previous.get('methods', {}))})")
    if record.get("seed") != seed or record.get("grid") != grid:
        raise ValueError(f"{where}: method {method!r} was searched with seed {record.get('seed')} over another grid "
                         f"or seed than this one (seed {seed}); tune it afresh")
    if "precision" not in record and not explicit:
        raise ValueError(f"{where}: method {method!r}'s search recorded no precision setting (it predates the "
                         f"record): give --precision, the setting its runs used (its bench rows' results.json "
                         f"record it; none there means fp32)")
    if record.get("precision", precision) != precision:
        raise ValueError(f"{where}: method {method!r} was searched with precision {record['precision']!r}, "
                         f"this run's is {precision!r}: resume with --precision {record['precision']}")
    runs = [*zip(record["grid"], record["validation_A_T"]),
            *((e["point"], e["validation_A_T"]) for e in record.get("extensions", []))]
    return {_key(point): score for point, score in runs}, record.get("extensions", [])


PROGRESS_FILE = "tune-progress.json"


class SearchProgress:
    """The scores measured so far by unfinished searches in ``out``, one entry per method, each
    valid only for the suite, seed, grid and precision setting it was measured with.

    A stopped search loses nothing. Each configuration's score is written to
    ``tune-progress.json`` beside selection.json as soon as it is measured (atomically). A tune of
    the same method, suite, seed, grid and precision setting into the same ``--out`` reads those
    scores instead of running them again, and says how many it read (``"progress_read"`` in the
    record), so a search longer than one sitting (wordnet's whole-model rows on a CPU) finishes over
    several. A method's entry is removed once its pick is in selection.json (``--resume`` continues
    from there), so a later search after a code change measures afresh.
    """

    def __init__(self, out: Path) -> None:
        self.path = out / PROGRESS_FILE
        self.entries: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def _entry(self, method: str, suite: str, seed: int, grid: list[Point], precision: str) -> dict | None:
        """``method``'s entry if it was measured by this very search (suite, seed, grid, precision)."""
        entry = self.entries.get(method)
        identity = {"suite": suite, "seed": seed, "grid": grid, "precision": precision}
        return entry if entry and all(entry.get(k) == v for k, v in identity.items()) else None

    def scores(self, method: str, suite: str, seed: int, grid: list[Point], precision: str) -> dict[str, float]:
        """The scores recorded for this very search of ``method``; {} for another search's."""
        entry = self._entry(method, suite, seed, grid, precision)
        return dict(entry["scores"]) if entry else {}

    def record(self, method: str, suite: str, seed: int, grid: list[Point], precision: str, point: Point,
               score: float) -> None:
        entry = self._entry(method, suite, seed, grid, precision)
        if entry is None:  # a first score, or another search's entry, which this one replaces
            entry = self.entries[method] = {"suite": suite, "seed": seed, "grid": grid, "precision": precision,
                                            "scores": {}}
        entry["scores"][_key(point)] = score
        self._write()

    def finish(self, method: str) -> None:
        if self.entries.pop(method, None) is not None:
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.entries:
            atomic_write_text(self.path, json.dumps(self.entries, indent=2, sort_keys=True) + "\n")
        else:
            self.path.unlink(missing_ok=True)


def tune(suite: SuiteConfig, methods: list[str], out: Path, seed: int = 0, command: str | None = None,
         progress: bool = False, max_extensions: int | None = None, resume: Path | None = None) -> dict[str, Any]:
    """Tune ``methods`` on ``suite``'s validation split by the one search rule (module docstring) into
    ``out``/selection.json; ``max_extensions`` None: ``MAX_EXTENSIONS``, the limit of every committed search."""
    max_extensions = MAX_EXTENSIONS if max_extensions is None else max_extensions
    if not suite.validation_per_class:
        raise ValueError(f"suite {suite.name!r} has no validation split (set validation_per_class)")
    if isinstance(max_extensions, bool) or not isinstance(max_extensions, int) or max_extensions < 0:
        raise ValueError(f"max_extensions must be an integer >= 0, got {max_extensions!r}")
    precision, source = setting_from(suite.training.get("precision"))
    # No probes while tuning, and no anytime evaluations: only the validation A_T decides.
    quiet = dataclasses.replace(suite, probe_forgetting=False)
    backbone, collator = load_suite_backbone(suite)
    plans = {}
    for method in methods:  # every grid is checked against the budget before anything trains
        config = resolve_run(suite, method, seed).adapter_config
        model = get_cl_model(copy.deepcopy(backbone), config)
        trains, frozen = bool(model.trainable_parameters()), model.reads_frozen_features()
        grid = search_grid(method, trains)
        known, earlier = (recorded_search(resume, suite.name, method, grid, seed, precision,
                                          explicit=source != "default") if resume else ({}, []))
        plans[method] = (config, trains, frozen, grid, known, earlier, model.method.epochs_share_prefix)
        del model
    stream = decode_stream_if_small(validation_stream(build_stream(suite, seed)), collator)
    train_examples = sum(len(e.train) for e in stream)
    n_validation = sum(len(e.test) for e in stream)  # the examples every validation A_T is measured on
    cached_stream = None
    if any(plan[2] for plan in plans.values()):
        cached_stream, _ = cache_stream_features(backbone, stream, collator)
    record: dict[str, Any] = {}
    progress_file = SearchProgress(out)
    for method, (config, trains, frozen, grid, known, earlier, share_epochs) in plans.items():
        reused, shared = [], []
        measured = progress_file.scores(method, suite.name, seed, grid, precision)  # a stopped run of this search
        progress_read = len(measured)
        if measured:
            print(f"[tune {suite.name}] {method}: {len(measured)} configurations read from "
                  f"{progress_file.path} (measured by a stopped run of this search)", flush=True)

        def score(point: Point) -> float:
            if _key(point) in known:  # resumed: the earlier search ran this point
                reused.append(point)
                return known[_key(point)]
            if _key(point) in measured:
                return measured[_key(point)]
            epochs = epoch_siblings(point, grid, done={**known, **measured}) if share_epochs else []
            batch = resolve_run(quiet, method, seed, selected=selected(point, config)).training.batch_size \
                if len(epochs) > 1 else 1
            if len(epochs) < 2 or train_examples % batch:  # one run per point
                epochs = [point.get(EPOCHS)]
            longest = {**point, EPOCHS: epochs[-1]} if len(epochs) > 1 else point
            started = time.perf_counter()
            result, _, _ = run_method(
                quiet, method, seed, stream=cached_stream if frozen else stream,
                collator=FeatureCollator() if frozen else None, selected=selected(longest, config),
                progress=progress, eval_every=train_examples // batch if len(epochs) > 1 else 0, evals_per_task=0,
            )
            # the e-epoch scores: the anytime evaluations at each epoch's last step (the stream's only
            # training is the last task's, so the global step counts from its start)
            at_step = dict(map(tuple, result.anytime)) if len(epochs) > 1 else {}
            scores = {e: at_step[e * train_examples // batch] for e in epochs[:-1]}
            scores[epochs[-1]] = summarize_result(result, suite.scenario)["A_T"]
            seconds = time.perf_counter() - started
            if len(epochs) > 1:
                shared.append({"point": longest, "read_at_epochs": epochs[:-1]})
            for e, a_t in scores.items():
                scored = {**point, EPOCHS: e} if len(epochs) > 1 else point
                read_off = len(epochs) > 1 and e != epochs[-1]
                how = f", read at epoch {e} of the {epochs[-1]}-epoch run" if read_off else ""
                print(f"[tune {suite.name}] {method} {scored}: validation A_T {a_t:.4f} ({seconds:.0f}s{how})",
                      flush=True)
                progress_file.record(method, suite.name, seed, grid, precision, scored, a_t)
                measured[_key(scored)] = a_t
            return measured[_key(point)]

        def valid(point: Point) -> bool:
            try:
                resolve_run(suite, method, seed, selected=selected(point, config))
            except ValueError:
                return False
            return True

        found = search(grid, score, valid, max_extensions, earlier, n_validation=n_validation)
        record[method] = {**found, "pick": selected(found["pick_point"], config), "seed": seed, "trains": trains,
                          "metric": "A_T on the validation split", "max_extensions": max_extensions,
                          "precision": precision,
                          **({"progress_read": progress_read} if progress_read else {}),
                          **({"shared_epochs": shared} if shared else {}),
                          **({"resumed": {"from": str(resume),
                                          "runs_read": len(reused) + sum(e["point"] not in grid for e in earlier)}}
                             if resume else {})}
    selection = {"suite": suite.name, "methods": record, "learning_rates": list(LEARNING_RATES),
                 "weight_decays": list(WEIGHT_DECAYS), "budget": BUDGET, "max_extensions": MAX_EXTENSIONS,
                 "se_multiple": SE_MULTIPLE, "inert_tolerance": TOLERANCE,
                 "commands": [command] if command else []}
    path = out / "selection.json"
    if path.is_file():  # tuning more methods adds to the same file
        previous = json.loads(path.read_text())
        if previous.get("suite") == suite.name:
            selection["methods"] = {**previous["methods"], **record}
            selection["commands"] = previous.get("commands", []) + selection["commands"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(selection, indent=2, sort_keys=True) + "\n")
    for method in record:  # their scores are in selection.json now (--resume continues from there)
        progress_file.finish(method)
    return selection
