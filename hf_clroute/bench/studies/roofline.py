"""Roofline of this machine: matmul peaks in fp32/bf16/fp64, and what the main workloads reach.

``python -m hf_clroute.bench.studies.roofline --out results/speed/roofline.json`` measures, at one torch
thread (``--threads``) unless told otherwise:

- the matmul peak: square matmuls (``--matmul-size``), best of several, per dtype;
- each workload in fp32 and under bf16 autocast, interleaved in pairs (fp32 first in even pairs,
  bf16 first in odd ones) so a change in the machine's load hits both alike: the small ViT's online
  step and MiniLM's step (forward, backward, clipping, AdamW), frozen-feature extraction and
  evaluation forwards at several batch sizes, and the statistics heads' updates (streaming LDA and
  RanPAC: a batch's accumulation, and the solve an evaluation triggers);
- time as this process's CPU time (``time.process_time``; one torch thread does all the work), so time
  the process spent descheduled by other jobs on a shared machine does not count;
- FLOPs by ``torch.utils.flop_counter`` (attention included, see :mod:`.flops`; a solve counted as
  ``2/3 M^3 + 2 M^2 K``), so achieved FLOP/s = FLOPs / median time, set against the peak of the
  dtype the work ran in.

The JSON's ``precision`` block is what ``hf_clroute/backbones/bf16_speedups.json`` (the table
:data:`hf_clroute.backbones.precision.MEASURED` reads) is copied from. The
machine's load average is recorded at the start and the end: CPU time still rises under load (shared
caches and memory bandwidth), so on a shared machine the ratios within a pair mean more than the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.backbones.catalog import (
    get_backbone_spec,
    get_base_model,
    load_backbone,
    pooled_features,
)
from hf_clroute.backbones.precision import autocast, bf16_hardware
from hf_clroute.bench.harness.flops import countable_attention

DTYPES = {"fp32": None, "bf16": torch.bfloat16}
clock = time.process_time  # CPU seconds of this process: a shared machine's other jobs do not count


def matmul_peak(dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best FLOP/s of ``n x n @ n x n`` in ``dtype`` (one warm-up call first)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        a @ b
        best = min(best, clock() - start)
    return 2 * n**3 / best


def count(fn: Callable[[], Any]) -> int:
    """FLOPs of one call of ``fn`` (forward and backward alike), attention included."""
    from torch.utils.flop_counter import FlopCounterMode

    with countable_attention(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def paired_times(run: Callable[[torch.dtype | None], None], pairs: int, calls: int) -> dict[str, list[float]]:
    """Seconds per call, fp32 and bf16, ``pairs`` interleaved blocks of ``calls`` (warm-up first)."""
    for dtype in DTYPES.values():
        run(dtype)
    times: dict[str, list[float]] = {name: [] for name in DTYPES}
    for pair in range(pairs):
        order = list(DTYPES.items()) if pair % 2 == 0 else list(DTYPES.items())[::-1]
        for name, dtype in order:
            start = clock()
            for _ in range(calls):
                run(dtype)
            times[name].append((clock() - start) / calls)
    return times


# ---- workloads ----------------------------------------------------------------------------------


def backbone_inputs(model: nn.Module, batch: int, tokens: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if get_backbone_spec(model).modality == "image":
        c, size = model.config.num_channels, model.config.image_size
        return {"pixel_values": torch.randn(batch, c, size, size, generator=gen)}
    ids = torch.randint(1000, model.config.vocab_size, (batch, tokens), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def train_step_fn(model: nn.Module, batch: int, tokens: int, classes: int = 10):
    """One fine-tuning step as the trainer runs it: forward under the autocast, loss in fp32, clipping,
    AdamW (torch's fused step under bf16, the per-parameter loop in fp32, as ``TrainingConfig`` does)."""
    spec, inputs = get_backbone_spec(model), backbone_inputs(model, batch, tokens)
    head = nn.Linear(spec.hidden_size(model), classes)
    params = [*model.parameters(), *head.parameters()]
    optimizers = {None: torch.optim.AdamW(params, lr=1e-5),
                  torch.bfloat16: torch.optim.AdamW(params, lr=1e-5, fused=True)}
    labels = torch.arange(batch) % classes
    model.train()

    def run(dtype: torch.dtype | None) -> None:
        with autocast(dtype):
            logits = head(pooled_features(spec, model(**inputs), inputs.get("attention_mask")))
        F.cross_entropy(logits.float(), labels).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizers[dtype].step()
        optimizers[dtype].zero_grad(set_to_none=True)
    return run


def forward_fn(model: nn.Module, batch: int, tokens: int):
    """The frozen backbone's pooled features of one batch, in eval mode, without gradients."""
    spec, inputs = get_backbone_spec(model), backbone_inputs(model, batch, tokens)

    @torch.no_grad()
    def run(dtype: torch.dtype | None) -> None:
        model.eval()
        with autocast(dtype):
            pooled_features(spec, model(**inputs), inputs.get("attention_mask")).float()
    return run


def head_fns(kind: str, dim: int, classes: int, batch: int) -> tuple[Callable, Callable, int]:
    """(accumulate one batch, solve, the solve's FLOPs) of a statistics head, features in fp32."""
    from hf_clroute.heads import build_head

    head = build_head(kind, dim)
    head.grow(classes)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, dim, generator=gen), torch.arange(batch) % classes
    head.accumulate(torch.randn(4 * classes, dim, generator=gen), torch.arange(4 * classes) % classes)
    head.sync()
    m = getattr(head, "projection_dim", dim)
    solve_flops = int(2 / 3 * m**3 + 2 * m * m * classes)
    return (lambda: head.accumulate(x, y)), (lambda: (head.accumulate(x, y), head.sync())), solve_flops


# ---- the benchmark --------------------------------------------------------------------------------


def load(name: str) -> nn.Module:
    from hf_clroute.bench.harness.suites import resolve_backbone_path

    model, _ = load_backbone(resolve_backbone_path(name))
    return get_base_model(model)


def workload_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    backbones = {"vit": ("pretrained-vit:vit-mnist-stream", 0), "minilm": ("minilm", args.tokens)}
    plan = [("vit", "train", args.vit_train_batches), ("vit", "infer", args.vit_infer_batches),
            ("minilm", "train", args.minilm_train_batches), ("minilm", "infer", args.minilm_infer_batches)]
    models = {}
    for short, kind, batches in plan:
        if short not in models:
            models[short] = load(backbones[short][0])
        model, tokens = models[short], backbones[short][1]
        spec = get_backbone_spec(model)
        for batch in batches:
            run = (train_step_fn if kind == "train" else forward_fn)(model, batch, tokens)
            flops = count(lambda: run(None))
            calls = max(1, min(args.calls, int(args.seconds_per_block * 4e10 / max(flops, 1))))
            times = paired_times(run, args.pairs, calls)
            rows.append(_row(f"{short} {kind}", spec.model_type, spec.hidden_size(model), kind, batch, flops, times))
            print(_line(rows[-1]), flush=True)
    return rows


def head_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for kind in ("lda", "ranpac"):
        accumulate, solve, solve_flops = head_fns(kind, args.head_dim, args.head_classes, args.head_batch)
        for what, fn, extra in (("accumulate", accumulate, 0), ("accumulate+solve", solve, solve_flops)):
            flops = count(fn) + extra
            fn()
            seconds = []
            for _ in range(args.pairs):
                start = clock()
                fn()
                seconds.append(clock() - start)
            rows.append({"workload": f"{kind} {what}", "phase": "head", "batch": args.head_batch, "flops": flops,
                         "dtype": "fp64", "seconds": {"fp64": seconds},
                         "median_s": {"fp64": statistics.median(seconds)},
                         "gflops": {"fp64": flops / statistics.median(seconds) / 1e9},
                         "samples_per_s": {"fp64": args.head_batch / statistics.median(seconds)}})
            print(f"{rows[-1]['workload']:<28} batch {args.head_batch:>4}  "
                  f"fp64 {rows[-1]['gflops']['fp64']:7.1f} GFLOP/s", flush=True)
    return rows


def _row(name, model_type, hidden, kind, batch, flops, times) -> dict[str, Any]:
    median = {k: statistics.median(v) for k, v in times.items()}
    ratios = [f / b for f, b in zip(times["fp32"], times["bf16"])]
    return {"workload": name, "model_type": model_type, "hidden_size": hidden, "phase": kind, "batch": batch,
            "flops": flops, "seconds": times, "median_s": median,
            "gflops": {k: flops / v / 1e9 for k, v in median.items()},
            "samples_per_s": {k: batch / v for k, v in median.items()},
            "bf16_speedup": statistics.median(ratios), "bf16_speedup_per_pair": ratios}


def _line(row: dict[str, Any]) -> str:
    g, s = row["gflops"], row["samples_per_s"]
    return (f"{row['workload']:<28} batch {row['batch']:>4}  fp32 {g['fp32']:7.1f} GFLOP/s {s['fp32']:8.1f}/s"
            f"  bf16 {g['bf16']:7.1f} GFLOP/s {s['bf16']:8.1f}/s  bf16/fp32 x{row['bf16_speedup']:.2f}")


def precision_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (backbone, phase): speed-up by batch and the smallest batch from which bf16 stays faster.
    Inference rows stand for both the ``features`` and the ``eval`` phase (the same backbone forward)."""
    out = []
    for row_kind, phases in (("train", ("train",)), ("infer", ("features", "eval"))):
        groups: dict[tuple[str, int], dict[int, float]] = {}
        for row in rows:
            if row.get("phase") == row_kind:
                groups.setdefault((row["model_type"], row["hidden_size"]), {})[row["batch"]] = row["bf16_speedup"]
        for (model_type, hidden), speedup in groups.items():
            min_batch = None
            for batch in sorted(speedup, reverse=True):
                if speedup[batch] <= 1.0:
                    break
                min_batch = batch
            for phase in phases:
                out.append({"model_type": model_type, "hidden_size": hidden, "phase": phase,
                            "min_batch": min_batch, "speedup": {b: round(v, 2) for b, v in sorted(speedup.items())}})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/speed/roofline.json")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--matmul-repeats", type=int, default=20, help="the peak is the best of this many")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved fp32/bf16 blocks per workload")
    parser.add_argument("--calls", type=int, default=10, help="most calls per block")
    parser.add_argument("--seconds-per-block", type=float, default=0.5,
                        help="rough block length (FLOP budget at 40 GFLOP/s)")
    parser.add_argument("--tokens", type=int, default=24, help="MiniLM sequence length (wordnet's max_length)")
    parser.add_argument("--vit-train-batches", type=_ints, default=[10, 256])
    parser.add_argument("--vit-infer-batches", type=_ints, default=[10, 64, 256])
    parser.add_argument("--minilm-train-batches", type=_ints, default=[10, 32])
    parser.add_argument("--minilm-infer-batches", type=_ints, default=[10, 128, 256])
    parser.add_argument("--head-dim", type=int, default=384)
    parser.add_argument("--head-classes", type=int, default=40)
    parser.add_argument("--head-batch", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started, load_start = time.time(), os.getloadavg()
    peaks = {name: matmul_peak(dtype, args.matmul_size, args.matmul_repeats) / 1e9
             for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp64", torch.float64))}
    print("matmul peak (GFLOP/s): " + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()), flush=True)
    rows = workload_rows(args) + head_rows(args)
    for row in rows:
        row["fraction_of_peak"] = {k: v / peaks[k] for k, v in row["gflops"].items()}
    hardware = bf16_hardware("cpu")
    report = {
        "command": "python -m hf_clroute.bench.studies.roofline "
                   + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": round(time.time() - started, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "usable_cores": len(os.sched_getaffinity(0)),
                    "torch": torch.__version__, "threads": torch.get_num_threads(), "bf16_hardware": hardware},
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "settings": vars(args), "clock": "process CPU time (time.process_time)", "matmul_peak_gflops": peaks,
        "workloads": rows, "precision": precision_table(rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {args.out} (load average {load_start[0]:.1f} -> {report['load_average']['end'][0]:.1f})")
    return report


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


if __name__ == "__main__":
    main()
