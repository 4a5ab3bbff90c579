"""`hf-clroute bench`: every requested method over the same stream and seeds.

Writes ``results.json`` (the shape every benchmark keeps) and ``results.md``
(one table: methods as rows). Each (method, seed) starts from a freshly loaded
backbone; the stream for a seed is built once and shared by all methods.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import Accelerator

from hf_clroute.bench.harness.feature_cache import (
    FeatureCollator,
    backbone_throughput,
    cache_stream_features,
)
from hf_clroute.bench.harness.probes import (
    PROBE_NAME,
    ForgettingProbes,
    forgetting_split,
)
from hf_clroute.bench.harness.relabel import rename_rows
from hf_clroute.bench.harness.results import mixed_precisions, pick_record, write_run
from hf_clroute.bench.harness.routing_health import (
    RoutingHealthRecorder,
    final_health,
    tracks_routing,
)
from hf_clroute.bench.harness.settings import RunSettings, resolve_run
from hf_clroute.bench.harness.suites import (
    NOT_MEASURED,
    SuiteConfig,
    build_stream,
    check_mergeable,
    drop_methods,
    joined_config,
    load_selection,
    load_suite_backbone,
)
from hf_clroute.bench.harness.verdicts import (
    PAIRED_NOTE,
    above_floor,
    comparisons,
    deep_forgetting_floor,
    paired_cell,
    probe_of,
)
from hf_clroute.bench.reports.plots import write_plots
from hf_clroute.bench.reports.report import (
    EDGE_NOTE,
    PRECISION_NOTE,
    marks,
    se_cell,
    seed_count,
    seeds_mark,
)
from hf_clroute.core.model import CLModel, get_cl_model
from hf_clroute.core.registry import method_key
from hf_clroute.data.collate import decode_stream_if_small
from hf_clroute.engine import ContinualTrainer, StreamResult, make_accelerator
from hf_clroute.engine.checkpoint import check_resume, run_fingerprint
from hf_clroute.hub.io import atomic_write_text
from hf_clroute.metrics import aggregate_runs, format_mean_std, mean_std, summarize
from hf_clroute.metrics.aggregate import one_seed_only, seeds_caption

METRIC_KEYS = ("A_T", "F_T", "A_bar", "BWT", "FWT", "A_AUC")
PROBE_KEYS = ("deep_forgetting", "probe_A_T", "snr_final")
UNDEFINED_NOTE = ("A row that trains only at the last task (joint-offline: the offline upper bound) has A_T alone; "
                  "its Ā, F_T, BWT and A_AUC would score the untrained model, so they are —. ")
ROUTING_KEYS = ("routing_entropy_ratio", "routing_top_weight", "routing_same_top_token")


def run_method(
    suite: SuiteConfig,
    method: str,
    seed: int,
    stream: list | None = None,
    collator: Any = None,
    accelerator: Accelerator | None = None,
    resume_from: str | None = None,
    config_overrides: dict[str, Any] | None = None,
    selected: dict[str, Any] | None = None,
    from_adapter: str | None = None,
    overrides_source: str = "overrides",
    **training_overrides: Any,
) -> tuple[StreamResult, Any, RunSettings]:
    """Train one method over the suite's stream for one seed; returns (result, model, settings).

    ``from_adapter`` (a directory or Hub repo id) continues that adapter instead of a fresh
    one: its own config is kept, the suite gives the stream and the training settings, and the
    trainer appends the stream's new classes after the ones the adapter knows.

    ``stream``/``collator`` override the suite's (the bench passes cached features);
    ``selected`` are the hyper-parameters ``hf-clroute tune`` chose on validation.
    ``overrides_source`` names where ``training_overrides`` came from, for messages and records.
    ``resume_from``: a checkpoint (root) of this very run; one written for another suite or
    other settings is refused before anything is loaded (``checkpoint.check_resume``).
    """
    settings = resolve_run(suite, method, seed, training_overrides, config_overrides, selected, overrides_source)
    fingerprint = run_fingerprint(measured_suite(suite), dataclasses.asdict(settings.training))
    if resume_from:
        check_resume(resume_from, fingerprint)
    backbone, suite_collator = load_suite_backbone(suite)
    stream = stream if stream is not None else decode_stream_if_small(build_stream(suite, seed), suite_collator)
    config = settings.adapter_config
    # Record the suite's backbone id ("pretrained-vit:<recipe>", "minilm", a Hub id), which
    # anyone can resolve, rather than the local path it was loaded from.
    config.base_model_name_or_path = suite.backbone
    if from_adapter:
        model = load_adapter_to_continue(backbone, from_adapter, suite)
        settings = dataclasses.replace(settings, adapter_config=model.config)
    else:
        model = get_cl_model(backbone, config)
    training = settings.training
    callbacks = [ForgettingProbes()] if suite.probe_forgetting and model.spec.modality != "lm" else []
    if tracks_routing(model):
        callbacks.append(RoutingHealthRecorder())
    trainer = ContinualTrainer(
        model, stream, training, collator or suite_collator, accelerator or make_accelerator(training),
        callbacks=callbacks, run_info={"suite": suite.name, "run_method": method, "fingerprint": fingerprint},
    )
    return trainer.fit(resume_from=resume_from), model, settings


def measured_suite(suite: SuiteConfig) -> dict[str, Any]:
    """The suite's fields that decide what a run measures (what results.json and checkpoints record)."""
    return {k: v for k, v in dataclasses.asdict(suite).items() if k not in ("quick", *NOT_MEASURED)}


def load_adapter_to_continue(backbone: Any, from_adapter: str, suite: SuiteConfig) -> Any:
    """The adapter at ``from_adapter`` on ``backbone``, checked to be one for the suite's backbone."""
    # is_trainable: loading gives a frozen adapter for inference (as PEFT does); continuing trains it
    model = CLModel.from_pretrained(backbone, from_adapter, is_trainable=True)
    base = model.config.base_model_name_or_path
    if base and base != suite.backbone:
        raise ValueError(f"adapter {from_adapter} was trained on backbone {base!r}, but suite {suite.name!r} uses "
                         f"{suite.backbone!r}; continue it on a suite with its backbone")
    return model


def adapter_method(from_adapter: str, methods: list[str] | None) -> list[str]:
    """The one method a run continuing ``from_adapter`` trains: the adapter's, or a variant of it."""
    from hf_clroute.bench.harness.settings import registered_method
    from hf_clroute.core.config import CLConfig

    method = CLConfig.from_pretrained(from_adapter).method
    if not methods:
        return [method]
    if len(methods) != 1 or registered_method(methods[0]) != method:
        raise ValueError(f"--from-adapter continues one {method!r} adapter; --methods must be {method!r} (or one "
                         f"of its variants), got {methods}")
    return list(methods)


def uses_cached_features(suite: SuiteConfig, method: str, backbone: Any) -> bool:
    """Whether ``method`` on this suite reads only the frozen backbone's pooled features, so the
    bench may feed it cached features (checked on the attached model, see ``CLModel.reads_frozen_features``)."""
    config = resolve_run(suite, method, 0).adapter_config
    return get_cl_model(copy.deepcopy(backbone), config).reads_frozen_features()


def method_curves(model: Any) -> dict[str, list[list[float]]]:
    """Series over the stream for plots: every ``*_history`` entry of the method's saved state."""
    return {k: v for k, v in model.method.extra_state().items() if k.endswith("_history")}


def summarize_result(result: StreamResult, scenario: str) -> dict[str, Any]:
    """One (method, seed) row: the continual metrics (FWT is None where undefined: class-IL),
    throughput, memory and, when probed, shallow/deep forgetting."""
    anytime = [acc for _, acc in result.anytime] or None
    row = {
        **summarize(result.accuracy_matrix, result.untrained_accuracy, anytime, scenario=scenario),
        "train_samples_per_s": result.train_samples_per_s,
        "infer_samples_per_s": result.infer_samples_per_s,
        "peak_mem_mb": result.peak_mem_mb,
        "wall_s": None,
    }
    row |= {key: None for key in result.records.get("undefined_metrics", ())}  # n/a, not a misleading number
    probes = result.records.get("probes", {})
    if probes.get("final"):
        diag = [p["probe_accuracy"] for p in probes["diag"]]
        final = [p["probe_accuracy"] for p in probes["final"]]
        split = forgetting_split(result.accuracy_matrix, diag, final)
        row |= {
            "probe": PROBE_NAME,
            "deep_forgetting": split["deep"],
            "deep_forgetting_per_task": split["deep_per_task"],
            "head_forgetting_per_task": split["head_per_task"],
            "probe_A_T": sum(final) / len(final),
            "snr_final": sum(p["snr"] for p in probes["final"]) / len(probes["final"]),
        }
    if result.records.get("routing"):
        row |= {"routing_health": result.records["routing"], **final_health(result.records["routing"])}
    # what ran in which precision and on how many threads, so bf16 rows are told from fp32 ones
    row |= {key: result.records[key] for key in ("precision", "threads") if key in result.records}
    return row


def run_bench(
    suite: SuiteConfig,
    methods: list[str],
    seeds: list[int],
    out: Path,
    progress: bool = True,
    command: str | None = None,
    merge: bool = False,
    selection: dict[str, Any] | None = None,
    from_adapter: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict:
    """Every method over the suite's stream for every seed; ``selection`` (from ``hf-clroute tune``)
    gives each method's hyper-parameters chosen on validation, recorded with the results.
    ``from_adapter``: continue that adapter (one method) instead of training fresh ones.
    ``overrides``: training values from the command line (e.g. ``precision``), above every other layer."""
    selection = selection or {}
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    reference: list[dict[str, float]] = []
    settings_by_method: dict[str, dict[str, Any]] = {}
    probe_backbone, _ = load_suite_backbone(suite)
    if from_adapter:  # a continued adapter keeps its own config: ask the adapter itself
        continued = CLModel.from_pretrained(copy.deepcopy(probe_backbone), from_adapter)
        cached = set(methods) if continued.reads_frozen_features() else set()
        del continued
    else:
        cached = {m for m in methods if uses_cached_features(suite, m, probe_backbone)}
    del probe_backbone
    test_size = None
    for seed in seeds:
        backbone, collator = load_suite_backbone(suite)
        stream = decode_stream_if_small(build_stream(suite, seed), collator)  # once for every method of the seed
        test_size = test_size or sum(len(e.test) for e in stream)  # the same test set for every seed
        batch_size = resolve_run(suite, "finetune", seed).training.batch_size
        reference.append(backbone_throughput(backbone, stream[0], collator, batch_size))
        feature_stream, cache_s = cache_stream_features(backbone, stream, collator) if cached else (None, 0.0)
        for method in methods:
            started = time.perf_counter()
            use_cache = method in cached
            result, model, settings = run_method(
                suite, method, seed,
                stream=feature_stream if use_cache else stream,
                collator=FeatureCollator() if use_cache else None,
                progress=progress,
                selected=selection.get(method, {}).get("pick"),
                from_adapter=from_adapter,
                overrides_source="command line",
                **(overrides or {}),
            )
            row = summarize_result(result, suite.scenario)
            row |= getattr(model.method, "run_records", dict)()  # what the method counted (e.g. consolidations)
            row["wall_s"] = time.perf_counter() - started + (cache_s if use_cache else 0.0)
            row["selection"] = pick_record(selection.get(method))  # a merge refuses seeds run with other picks
            if use_cache:
                row["feature_precision"] = feature_stream[0].info.get("feature_precision")
            solved = getattr(model.head, "solved_lambda", None)  # a ridge head: the lambda its last solve used
            if solved is not None:
                row["ridge_lambda"] = solved
            runs[method].append(seed_row(seed, result, row, method_curves(model)))
            if seed == seeds[0]:
                settings_by_method[method] = settings.to_dict()
                layers = sorted(set(settings.sources.values()) - {"run seed"})
                print(f"[{suite.name}] {method}: settings from {', '.join(layers)} (all values: results.json)")
            if seed == seeds[0]:  # one adapter per method, for `hf-clroute push`
                model.save_pretrained(out / "adapters" / method)
            f_t = "n/a" if row["F_T"] is None else f"{row['F_T']:.3f}"
            print(f"[{suite.name}] seed {seed} {method}: A_T={row['A_T']:.3f} F_T={f_t} ({row['wall_s']:.0f}s)")
    results = {
        "kind": "classification",
        "suite": suite.name,
        "seeds": seeds,
        "commands": [command],
        "config": {k: v for k, v in dataclasses.asdict(suite).items() if k != "quick"},
        "reference": {"bare_backbone": aggregate_runs(reference), "per_seed": reference},
        "test_size": test_size,
        **({"from_adapter": str(from_adapter)} if from_adapter else {}),
        "methods": {m: {**aggregate_method(r), "features_cached": m in cached, "settings": settings_by_method[m],
                        "selection": selection.get(m)}
                    for m, r in runs.items()},
    }
    results = with_verdicts(merge_previous(out / "results.json", results) if merge else results)
    write_run(out, results, results_markdown(results))
    write_plots(results, out / "plots")
    return results


def merge_previous(path: Path, results: dict) -> dict:
    """Combine this invocation with an earlier run of the same suite in ``path``.

    New methods are added; a method run for other seeds gets its seed rows joined
    and re-aggregated (so seeds can run as parallel processes). The stream is a
    pure function of (suite, seed), so every invocation saw identical data; the
    recorded commands show how the results were produced.
    """
    return merge_results(json.loads(path.read_text()), results) if path.is_file() else results


def merge_results(previous: dict, results: dict) -> dict:
    try:
        check_mergeable([previous, results], SuiteConfig)
    except ValueError as err:
        raise ValueError(f"{err}; use another --out or drop --merge") from None
    methods = dict(previous["methods"])
    for name, row in results["methods"].items():
        old_rows = [r for r in methods.get(name, {}).get("per_seed", []) if r["seed"] not in results["seeds"]]
        methods[name] = {**aggregate_method(old_rows + row["per_seed"]), "features_cached": row["features_cached"],
                         "settings": row.get("settings"), "selection": row.get("selection")}
    reference = [r for r in previous.get("reference", {}).get("per_seed", [])] + results["reference"]["per_seed"]
    return with_verdicts({
        **results,
        "config": joined_config([previous, results]),
        "seeds": sorted(set(previous["seeds"]) | set(results["seeds"])),
        "methods": methods,
        "reference": {"bare_backbone": aggregate_runs([r for r in reference if r]), "per_seed": reference},
        "commands": previous.get("commands", []) + results["commands"],
        "test_size": results.get("test_size") or previous.get("test_size"),
    })


def with_verdicts(results: dict) -> dict:
    """``results`` with each method's paired verdicts against its control and the suite's best statistics
    head (``methods.<m>.verdicts``, see ``report.comparisons``), recomputed from the per-seed rows."""
    for method, verdicts in comparisons(results["methods"]).items():
        results["methods"][method]["verdicts"] = verdicts
    floor = deep_forgetting_floor(results["methods"])
    results["deep_forgetting_floor"] = floor and {k: v for k, v in floor.items() if k != "per_seed"}
    for row in results["methods"].values():
        row["deep_forgetting_above_floor"] = above_floor(row, floor)
    return results


def run(name_or_path: str, *, methods: list[str] | None, seeds: list[int], quick: bool, out: str | Path,
        progress: bool = True, command: str | None = None, merge: bool = False,
        selection: str | Path | None = None, from_adapter: str | None = None,
        overrides: dict[str, Any] | None = None) -> dict:
    """The runner entry point (``hf-clroute bench``): a classification suite by name or path;
    ``selection``: a ``selection.json`` written by ``hf-clroute tune`` for this suite;
    ``from_adapter``: an adapter (directory or Hub repo id) to continue on the suite's stream;
    ``overrides``: the command line's training values."""
    suite = SuiteConfig.load(name_or_path, quick=quick)
    methods = adapter_method(from_adapter, methods) if from_adapter else list(methods or suite.method_names())
    picks = load_selection(selection, suite) if selection else {}
    for method in methods:  # every name resolves (and every settings file parses) before --out is created
        resolve_run(suite, method, seeds[0], overrides, selected=picks.get(method, {}).get("pick"),
                    overrides_source="command line")
    results = run_bench(suite, methods, seeds, Path(out), progress=progress, command=command, merge=merge,
                        selection=picks, from_adapter=from_adapter, overrides=overrides)
    if selection:
        record_selection(Path(out), Path(selection), [m for m in methods if m in picks])
    return results


def record_selection(out: Path, selection: Path, methods: list[str]) -> None:
    """The picks a bench run trained with, written beside its results (``out/selection.json``, added to
    what an earlier run left there), so that a later merge carries them with the rows."""
    if not methods:
        return
    chosen = json.loads(selection.read_text())
    chosen["methods"] = {m: chosen["methods"][method_key(chosen["methods"], m)] for m in methods}
    path = out / "selection.json"
    earlier = [json.loads(path.read_text())] if path.is_file() else []
    atomic_write_text(path, json.dumps(join_selections([*earlier, chosen]), indent=2, sort_keys=True) + "\n")


def merge(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = (), rename: dict[str, str] | None = None) -> dict:
    """Join bench runs of one suite (e.g. one per seed) into one results.json (+ plots)."""
    return merge_run_dirs(run_dirs, out, drop, rename or {})


def merge_run_dirs(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = (),
                   rename: dict[str, str] | None = None) -> dict:
    """One results.json/md (+ plots) from several bench runs of the same suite (e.g. one per seed),
    without the methods in ``drop`` (a retired variant, say); ``rename`` relabels each run's rows
    before they are joined, each checked (:mod:`hf_clroute.bench.harness.relabel`)."""
    rename, merged, renamed = rename or {}, None, set()
    for run_dir in run_dirs:
        results = json.loads((Path(run_dir) / "results.json").read_text())
        mine = {old: new for old, new in rename.items() if old in results["methods"]}
        if mine:
            rename_rows(results, mine, SuiteConfig.load(results["suite"]))
            renamed |= set(mine)
        merged = results if merged is None else merge_results(merged, results)
    if set(rename) - renamed:
        raise ValueError(f"--rename: no run has a row {sorted(set(rename) - renamed)}")
    drop_methods(merged["methods"], drop)
    out.mkdir(parents=True, exist_ok=True)
    for method in drop:  # its per-method plots would otherwise outlive it
        for stale in (out / "plots").glob(f"*_{method}.png"):
            stale.unlink()
    write_run(out, {**merged, "kind": "classification"}, results_markdown(merged))
    for method, groups in mixed_precisions(merged).items():  # joined, but never silently
        print(f"[merge] {method}: its seeds ran at different precisions ("
              + "; ".join(f"seeds {seeds}: {dtype}" for dtype, seeds in groups.items()) + "); the tables mark it ‡")
    write_plots(merged, out / "plots")
    merge_selections(run_dirs, out, drop, rename, rows=merged["methods"])
    return merged


def merge_selections(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = (),
                     rename: dict[str, str] | None = None, rows: dict[str, Any] | None = None) -> None:
    """The runs' ``selection.json`` files (from ``hf-clroute tune``) joined into ``out/selection.json``,
    so the merged table keeps, beside it, every pick it was trained with (a later run's pick wins).
    ``rows`` (the merged table's methods) win over the files: a method's entry is the record its rows ran
    with, so rows taken from a folder that kept no selection.json, or an older one, leave no stale pick."""
    selections = [json.loads(f.read_text()) for f in (Path(d) / "selection.json" for d in run_dirs) if f.is_file()]
    if selections:
        merged = join_selections(selections, drop, rename)
        merged["methods"].update({m: row["selection"] for m, row in (rows or {}).items()
                                  if (row.get("selection") or {}).get("pick") is not None})
        atomic_write_text(out / "selection.json", json.dumps(merged, indent=2, sort_keys=True) + "\n")


def join_selections(selections: list[dict], drop: tuple[str, ...] = (), rename: dict[str, str] | None = None) -> dict:
    """``selection.json`` records joined: the first one's header, every method's pick (a later record's
    wins; ``drop`` left out, ``rename`` applied), every command once, in order."""
    merged = {**selections[0], "methods": {}, "commands": []}
    for selection in selections:
        merged["methods"].update({(rename or {}).get(m, m): v for m, v in selection["methods"].items()
                                  if m not in drop})
        merged["commands"] += [c for c in selection.get("commands", []) if c not in merged["commands"]]
    return merged


def seed_row(seed: int, result: StreamResult, summary: dict[str, Any], curves: dict) -> dict[str, Any]:
    """Everything one (method, seed) run contributes; aggregates are computed from these rows."""
    return {
        "seed": seed,
        **summary,
        "accuracy_matrix": result.accuracy_matrix,
        "anytime": result.anytime,
        "trainable_params": int(result.params["trainable_params"]),
        "trainable_pct": float(result.params["trainable_pct"]),
        "curves": curves,
    }


def aggregate_method(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = METRIC_KEYS + PROBE_KEYS + ROUTING_KEYS + ("train_samples_per_s", "infer_samples_per_s", "wall_s")
    agg = aggregate_runs([{k: r.get(k) for k in keys} for r in rows])
    rows = sorted(rows, key=lambda r: r["seed"])
    return {
        **{k: agg.get(k) for k in keys},
        "curves": rows[0]["curves"],
        "trainable_params": rows[0]["trainable_params"],
        "trainable_pct": rows[0]["trainable_pct"],
        "peak_mem_mb": float(max(r["peak_mem_mb"] for r in rows)),
        "accuracy_matrix": np.mean([r["accuracy_matrix"] for r in rows], axis=0).round(4).tolist(),
        "per_seed": rows,
    }


def results_markdown(results: dict) -> str:
    one_seed = one_seed_only(seed_count(m) for m in results["methods"].values())  # said once, in the caption
    head = (
        f"# {results['suite']} (seeds {', '.join(map(str, results['seeds']))})\n\n"
        f"Accuracies in %, {seeds_caption(one_seed)}. Throughput in samples/s (training excludes evaluation). "
        "Methods marked * ran on cached frozen features: their throughput excludes the backbone.\n\n"
        "FWT is undefined (—) in class-incremental runs: the next task's classes are unreachable. "
        + (UNDEFINED_NOTE if any(m.get("A_T") and m.get("A_bar") is None for m in results["methods"].values()) else "")
        + "Deep F: forgetting of a linear probe over all classes seen so far, on the features the method "
        "classifies from (the head's own forgetting is −BWT); probe A_T: that probe's final average accuracy.\n\n"
        "SE: the test-sampling standard error of A_T (binomial, sqrt(p (1 - p) / N_test) on the fixed test set "
        f"of {results.get('test_size') or 'n/a'} examples). † : {EDGE_NOTE} A row run on fewer seeds than the "
        "table's says how many." + (f" {PRECISION_NOTE}" if mixed_precisions(results) else "") + "\n\n"
        "| method | A_T | SE | F_T | Ā | BWT | FWT | A_AUC | deep F | probe A_T | trainable % | train/s | infer/s "
        "| peak MB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for name, m in results["methods"].items():
        # "—": undefined (e.g. FWT in class-IL) or not measured
        fmt = functools.partial(format_mean_std, n=seed_count(m), mark_one_seed=not one_seed)
        metrics = " | ".join(fmt(m.get(k)) for k in METRIC_KEYS[1:] + PROBE_KEYS[:2])
        speed = " | ".join(fmt(m[k], scale=1, digits=0) for k in ("train_samples_per_s", "infer_samples_per_s"))
        label = f"{name}{'*' if m.get('features_cached') else ''}{marks(m)}{seeds_mark(m, len(results['seeds']))}"
        rows.append(f"| {label} | {fmt(m.get('A_T'))} | {se_cell(m, results.get('test_size'))} | {metrics} | "
                    f"{m['trainable_pct']:.2f} | {speed} | {m['peak_mem_mb']:.0f} |")
    bare = results.get("reference", {}).get("bare_backbone", {})
    if bare:
        speed = " | ".join(format_mean_std(bare.get(k), scale=1, digits=0)
                           for k in ("train_samples_per_s", "infer_samples_per_s"))
        rows.append(f"| *bare backbone (fwd+bwd / fwd)* | | | | | | | | | | 100.00 | {speed} | |")
    return (head + "\n".join(rows) + "\n" + verdicts_markdown(results) + floor_markdown(results)
            + routing_markdown(results))


def verdicts_markdown(results: dict) -> str:
    """Paired per-seed differences of A_T: each method against its control and the best statistics head."""
    compared = comparisons(results["methods"])
    shown = {m: c for m, c in compared.items() if c["control"] or c["statistics_head"]}
    if not shown:
        return ""
    lines = ["", "Paired verdicts. " + PAIRED_NOTE, "",
             "| method | control | method − control | best statistics head | method − head |",
             "|---|---|---|---|---|"]
    lines += [f"| {m} | {c['control'] or '—'} | {paired_cell(c['vs_control']) if c['control'] else '—'} | "
              f"{c['statistics_head'] or '—'} | "
              f"{paired_cell(c['vs_statistics_head']) if c['statistics_head'] else '—'} |" for m, c in shown.items()]
    return "\n".join(lines) + "\n"


def floor_markdown(results: dict) -> str:
    """Each probed method's deep forgetting against the frozen backbone's (the floor), paired per seed."""
    floor = results.get("deep_forgetting_floor")
    rows = {m: r for m, r in results["methods"].items() if r.get("deep_forgetting_above_floor")}
    if not floor or not rows:
        return ""
    lines = ["", f"Deep forgetting against its floor: the frozen backbone's own deep F is "
             f"{floor['mean'] * 100:.1f} ± {floor['std'] * 100:.1f} (the probe on `{floor['method']}`'s features, "
             "which are the backbone's: a growing label space alone costs this much). A method's deep F above the "
             "floor is what its training cost the features; paired per seed.", "",
             "| method | deep F | deep F − floor |", "|---|---|---|"]
    lines += [f"| {m} | {format_mean_std(r.get('deep_forgetting'), n=seed_count(r))} | "
              f"{paired_cell(r['deep_forgetting_above_floor'])} |"
              for m, r in rows.items() if m != floor["method"]]
    other: dict[str, list[str]] = {}  # probe label -> rows measured by it
    for m, r in results["methods"].items():
        if r.get("deep_forgetting") and m not in rows and m != floor["method"]:
            other.setdefault(probe_label(r), []).append(m)
    if other:
        groups = "; ".join(f"{', '.join(names)} ({label})" for label, names in other.items())
        lines += ["", f"Not set against the floor, their deep F measured by another probe than the floor's "
                      f"({probe_label(results['methods'][floor['method']])}): {groups}. See `probe` in results.json."]
    return "\n".join(lines) + "\n"


def probe_label(row: dict) -> str:
    """How a table names the probe that measured a row's deep forgetting."""
    probe = probe_of(row)
    return {None: "an earlier probe, not recorded", "mixed": "probes differing by seed"}.get(probe, f"probe {probe}")


def routing_markdown(results: dict) -> str:
    """Routing health after the last task, for the methods that route (mean over routed layers)."""
    routed = {name: m for name, m in results["methods"].items() if m.get("routing_entropy_ratio")}
    if not routed:
        return ""
    lines = ["", "Routing health after the last task (mean over routed layers and seeds; entropy / log L: 1 = "
             "uniform pooling, 0 = one token; same top token: share of inputs whose top-weighted token is the "
             "prompt's most frequent one, 1 = a fixed copy whatever the input):", "",
             "| method | entropy / log L | top weight | same top token |", "|---|---|---|---|"]
    lines += [f"| {name} | " + " | ".join(format_mean_std(m[k], scale=1, digits=2) for k in ROUTING_KEYS) + " |"
              for name, m in routed.items()]
    return "\n".join(lines) + "\n"


__all__ = ["run_bench", "run_method", "results_markdown", "mean_std"]
