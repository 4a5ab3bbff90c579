"""How long `import hf_clroute` and `hf-clroute --help` take, each in a fresh interpreter.

    python training/bench_imports.py --reps 5 --out results/imports/imports.json

Prints a table (median and max seconds over the repetitions) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "python -c pass (interpreter start-up)": [sys.executable, "-c", "pass"],
    "import hf_clroute": [sys.executable, "-c", "import hf_clroute"],
    "import hf_clroute.core.config": [sys.executable, "-c", "import hf_clroute.core.config"],
    "from hf_clroute import get_cl_model (first use: torch, transformers)": [
        sys.executable, "-c", "from hf_clroute import get_cl_model"],
    "hf-clroute --help": [sys.executable, "-m", "hf_clroute.cli", "--help"],
    "hf-clroute --version": [sys.executable, "-m", "hf_clroute.cli", "--version"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="repetitions per command (interleaved)")
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.reps):
        for name, command in COMMANDS.items():
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times[name].append(time.perf_counter() - started)
    rows = {name: {"median_s": statistics.median(t), "max_s": max(t), "runs": t} for name, t in times.items()}
    print("| command | median s | max s |\n|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_s']:.2f} | {row['max_s']:.2f} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "reps": args.reps, "commands": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
