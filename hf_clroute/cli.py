"""The `hf-clroute` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def cmd_data(args: argparse.Namespace) -> int:
    from .data.sources import SOURCES, prepare_source

    if args.action == "list":
        for name, recipe in SOURCES.items():
            print(f"{name:14s} {getattr(recipe, 'description', '')}")
        return 0
    for name in args.names or list(SOURCES):
        path = prepare_source(name, force=args.force)
        print(f"{name}: {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench
    from .suites import SuiteConfig, suite_runner

    out = Path(args.out)
    runner = suite_runner(args.suite)
    if runner is not None:  # suites with their own runner (language-model domains, plasticity)
        runner(args.suite, methods=args.methods, seeds=args.seeds, quick=args.quick, out=out)
    else:
        suite = SuiteConfig.load(args.suite)
        if args.quick:
            suite = suite.quick_version()
        run_bench(suite, args.methods or suite.method_names(), args.seeds, out, progress=not args.no_progress)
    print((out / "results.md").read_text())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    args.suite, args.quick, args.methods, args.seeds = "split-mnist", True, ["finetune", "ncm"], [0]
    return cmd_bench(args)


def cmd_methods(args: argparse.Namespace) -> int:
    from .registry import available_methods, get_method

    for name in available_methods():
        entry = get_method(name)
        print(f"{name:12s} {entry.config_class.__name__}: {(entry.method_class.__doc__ or '').strip().splitlines()[0]}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-clroute", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="build or list the offline data sources")
    data.add_argument("action", choices=["prepare", "list"])
    data.add_argument("names", nargs="*", help="sources to build (default: all)")
    data.add_argument("--force", action="store_true", help="rebuild even if cached")
    data.set_defaults(func=cmd_data)

    bench = sub.add_parser("bench", help="run methods side by side over one suite")
    bench.add_argument("--suite", required=True, help="built-in suite name or a suite JSON file")
    bench.add_argument("--methods", type=_csv(str), default=None, help="comma-separated (default: the suite's)")
    bench.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
    bench.add_argument("--quick", action="store_true", help="the suite's reduced version (CI, demo)")
    bench.add_argument("--out", required=True, help="directory for results.json and results.md")
    bench.add_argument("--no-progress", action="store_true")
    bench.set_defaults(func=cmd_bench)

    demo = sub.add_parser("demo", help="quick Split-MNIST: naive fine-tuning vs nearest-class-mean")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=cmd_demo)

    methods = sub.add_parser("methods", help="list registered methods and baselines")
    methods.set_defaults(func=cmd_methods)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:  # configuration and data errors: one clear line, no traceback
        print(f"hf-clroute: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
