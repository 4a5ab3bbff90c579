"""Training throughput under a competing load: torch's default threads against the library's default.

``python -m hf_clroute.bench.studies.thread_bench --out results/speed/threads.json`` starts ``--burners``
processes that each keep one core busy (a stand-in for another job on a shared machine), then runs the
same training benchmark (the small ViT's online fine-tuning step, batch 10, fp32, as in
:mod:`.roofline`) in fresh processes, interleaved in ``--pairs`` rounds, under:

- ``torch default``: ``OMP_NUM_THREADS`` set to the usable cores (what torch picks by itself);
- ``library default``: no thread setting, so :func:`hf_clroute.runtime.threads.apply_default_threads` decides;
- ``1 thread``: ``OMP_NUM_THREADS=1``.

With ``--command`` the timed work is that shell command instead (e.g. ``hf-clroute demo``). The load
average is recorded around every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hf_clroute.runtime.threads import THREAD_ENV, usable_cores

STEP_SCRIPT = """
import json, sys, time, torch
from hf_clroute.runtime.threads import apply_default_threads
applied = apply_default_threads()
from hf_clroute.bench.studies.roofline import load, train_step_fn
run = train_step_fn(load("pretrained-vit:vit-mnist-stream"), 10, 0)
for _ in range(5):
    run(None)
start, steps = time.perf_counter(), int(sys.argv[1])
for _ in range(steps):
    run(None)
print(json.dumps({"samples_per_s": 10 * steps / (time.perf_counter() - start), **applied}))
"""


def variants() -> dict[str, dict[str, str]]:
    """Environment changes per variant (None: the variable removed)."""
    cores = str(usable_cores())
    return {"torch default": {"OMP_NUM_THREADS": cores}, "library default": {}, "1 thread": {"OMP_NUM_THREADS": "1"}}


def run_variant(changes: dict[str, str], steps: int, command: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    env.update(changes)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    if command:
        subprocess.run(command, shell=True, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        row = {}
    else:
        done = subprocess.run([sys.executable, "-c", STEP_SCRIPT, str(steps)], env=env, check=True,
                              capture_output=True, text=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
    return {**row, "wall_s": time.perf_counter() - started, "load_average": [load, os.getloadavg()[0]]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/speed/threads.json")
    parser.add_argument("--burners", type=int, default=1, help="processes each keeping one core busy")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds the burners run before the first measurement (the load average follows slowly)")
    parser.add_argument("--command", default=None, help="time this shell command instead of the training steps")
    args = parser.parse_args(argv)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    rows: dict[str, list[dict]] = {name: [] for name in variants()}
    key = "wall_s" if args.command else "samples_per_s"
    command = "python -m hf_clroute.bench.studies.thread_bench " + " ".join(argv if argv is not None else sys.argv[1:])

    def write() -> dict:  # after every run: a long benchmark stopped early keeps what it measured
        summary = {name: statistics.median(r[key] for r in runs) for name, runs in rows.items() if runs}
        report = {"command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "usable_cores": usable_cores(),
                  "settings": vars(args), "measure": key, "median": summary, "runs": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        return report

    try:
        time.sleep(args.settle)
        for pair in range(args.pairs):
            names = list(variants()) if pair % 2 == 0 else list(variants())[::-1]
            for name in names:
                rows[name].append(run_variant(variants()[name], args.steps, args.command))
                print(name, rows[name][-1], flush=True)
                report = write()
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    summary = report["median"]
    for name, value in summary.items():
        print(f"{name:<16} {key} {value:8.1f}")
    return report


if __name__ == "__main__":
    main()
