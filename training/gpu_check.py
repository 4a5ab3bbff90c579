"""GPU check: the ViT-B/16-sized stand-in, a fixed number of steps per method, timed.

    python training/gpu_check.py                      # on a CUDA machine: a few minutes
    python training/gpu_check.py --precision no       # full precision instead of bf16
    python training/gpu_check.py --small --steps 2 --out runs/gpu_check    # the CPU smoke test

Builds a randomly initialised ViT with the real ``google/vit-base-patch16-224-in21k``
configuration (224x224, patch 16, 197 tokens, hidden 768, 12 layers; no download needed),
then for each method trains one task of ``--steps`` batches of random 224x224 RGB images
and evaluates on ``--eval-examples`` more, with the settings the ``split-cifar100`` suite
gives that method (so RwF routes the first 3 blocks with 8 prompts, MaRS starts with 32
slots, ...). Reports training samples/s, inference samples/s and peak GPU memory per
method as a table and as JSON (``<out>/gpu_check.json``, ``<out>/gpu_check.md``), plus the
time a full Split-CIFAR-100 run would take at those rates.

Random weights and random images: the speeds and memory are those of the real shapes; the
accuracies are meaningless and are not reported. Every method runs through the backbone
here; ``hf-clroute bench`` caches frozen features for methods that leave the backbone
untouched (statistics heads, MaRS, QOA, kNN), so their bench time is one backbone pass over
the data plus the head's own cost: this check is an upper bound for them.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

# Split-CIFAR-100 as the suite runs it: 50k training images seen once; test sets of 1000
# images per task evaluated at 5 points in each of the 10 tasks, over the tasks seen so far
# (and the next one at each task end).
CIFAR_TRAIN_IMAGES = 50_000
CIFAR_EVAL_IMAGES = sum(5 * (t + 1) * 1000 for t in range(10)) + 9 * 1000

DEFAULT_METHODS = "finetune,rwf,slda,ranpac,mars,qoa,lora"


def synthetic_stream(train: int, test: int, num_classes: int, seed: int) -> list:
    """One task of random uint8 224x224x3 images, already decoded (the collator's fast path):
    what the loop costs, without PNG decoding in the measurement."""
    from datasets import Array3D, ClassLabel, Dataset, DatasetDict, Features

    from hf_clroute.data import class_incremental

    rng = np.random.default_rng(seed)
    features = Features({"image": Array3D(shape=(224, 224, 3), dtype="uint8"),
                         "label": ClassLabel(num_classes=num_classes)})

    def split(n: int) -> Dataset:
        images = rng.integers(0, 256, size=(n, 224, 224, 3), dtype=np.uint8)
        labels = np.arange(n) % num_classes  # every class in every split
        return Dataset.from_dict({"image": images, "label": labels}, features=features).with_format("numpy")

    dsets = DatasetDict(train=split(train), test=split(test))
    return class_incremental(dsets, n_tasks=1, seed=seed, name="gpu-check")


def run_method(method: str, backbone: torch.nn.Module, stream: list, args: argparse.Namespace, device: str) -> dict:
    from hf_clroute import ContinualTrainer, get_cl_model
    from hf_clroute.backbones.pretraining.standins import vit_b16_processor
    from hf_clroute.bench.harness.settings import resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig
    from hf_clroute.data import ImageCollator
    from hf_clroute.engine import make_accelerator

    suite = SuiteConfig.load("split-cifar100")
    overrides = {"batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size, "evals_per_task": 0,
                 "eval_every": 0, "progress": False, "num_workers": 0}
    settings = resolve_run(suite, method, 0, overrides)
    model = get_cl_model(copy.deepcopy(backbone), settings.adapter_config)
    collator = ImageCollator.from_processor(vit_b16_processor())
    accelerator = make_accelerator(settings.training, cpu=device == "cpu")
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = ContinualTrainer(model, stream, settings.training, collator, accelerator).fit()
    if device == "cuda":
        torch.cuda.synchronize()
    train_sps, infer_sps = result.train_samples_per_s, result.infer_samples_per_s
    hours = (CIFAR_TRAIN_IMAGES / train_sps + CIFAR_EVAL_IMAGES / infer_sps) / 3600 if train_sps and infer_sps else None
    return {
        "train_samples_per_s": round(train_sps, 1),
        "infer_samples_per_s": round(infer_sps, 1),
        "peak_memory_mb": round(result.peak_mem_mb, 1),
        "peak_memory_is": "GPU (max allocated)" if device == "cuda" else "process RSS",
        "trainable_params": int(result.params.get("trainable_params", 0)),
        "steps": result.global_step,
        "timed_steps": result.global_step - ContinualTrainer.warmup_steps,
        "wall_s": round(time.perf_counter() - started, 2),
        "split_cifar100_hours": None if hours is None else round(hours, 2),
        "settings": settings.to_dict()["adapter_config"],
    }


def table(report: dict) -> str:
    lines = [f"GPU check, {report['date']}, {report['device']}, precision {report['precision']}, "
             f"batch {report['batch_size']}, {report['steps']} steps per method, "
             f"{'small stand-in' if report['small'] else 'ViT-B/16-sized stand-in'}", "",
             "| method | train samples/s | inference samples/s | peak memory (MB) | trainable params | "
             "est. Split-CIFAR-100 run (h) |",
             "|---|---:|---:|---:|---:|---:|"]
    for method, row in report["methods"].items():
        if "error" in row:
            lines.append(f"| {method} | failed: {row['error']} | | | | |")
            continue
        lines.append(f"| {method} | {row['train_samples_per_s']} | {row['infer_samples_per_s']} | "
                     f"{row['peak_memory_mb']} | {row['trainable_params']:,} | {row['split_cifar100_hours']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help="comma-separated methods (settings of split-cifar100)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per method")
    parser.add_argument("--batch-size", type=int, default=10, help="training batch (10: the suite's online batch)")
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--eval-examples", type=int, default=1024, help="test images evaluated per method")
    parser.add_argument("--precision", choices=["no", "bf16", "fp16"], default="bf16", help="mixed precision")
    parser.add_argument("--small", action="store_true",
                        help="hidden 32, 4 layers instead of ViT-B/16's 768 x 12 (same 197 tokens): for a CPU test")
    parser.add_argument("--out", default="results/gpu_check", help="directory for gpu_check.json and gpu_check.md")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    args = parser.parse_args(argv)
    from hf_clroute import ContinualTrainer

    if min(args.batch_size, args.eval_batch_size, args.eval_examples) < 2:
        parser.error("--batch-size, --eval-batch-size and --eval-examples must be at least 2")
    # The trainer leaves its first steps out of the training rate (start-up, allocator warm-up).
    if args.steps <= ContinualTrainer.warmup_steps:
        parser.error(f"--steps must be more than the {ContinualTrainer.warmup_steps} untimed warm-up steps")

    # Accelerate reads the precision from the environment, as `accelerate launch --mixed_precision` sets it.
    os.environ["ACCELERATE_MIXED_PRECISION"] = args.precision
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    from transformers import ViTModel

    from hf_clroute.backbones.pretraining.standins import vit_b16_config

    torch.manual_seed(0)
    backbone = ViTModel(vit_b16_config(small=args.small))
    # Ten classes, or fewer when a tiny CPU run has fewer images than that: every class needs a train and a test image.
    num_classes = min(10, args.eval_examples, args.steps * args.batch_size, args.eval_batch_size)
    stream = synthetic_stream(args.steps * args.batch_size, args.eval_examples, num_classes, seed=0)
    # Warm-up (CUDA context, kernel selection), not reported: one method, two batches.
    run_method("finetune", backbone, synthetic_stream(2 * args.batch_size, args.eval_batch_size, num_classes, 1),
               args, device)
    report = {
        "date": datetime.date.today().isoformat(),
        "device": (torch.cuda.get_device_name(0) if device == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()})"),
        "torch": torch.__version__, "precision": args.precision, "small": args.small, "steps": args.steps,
        "batch_size": args.batch_size, "eval_examples": args.eval_examples,
        "backbone": {k: getattr(backbone.config, k) for k in ("image_size", "patch_size", "hidden_size",
                                                               "num_hidden_layers", "num_attention_heads")},
        "methods": {},
    }
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        try:
            report["methods"][method] = run_method(method, backbone, stream, args, device)
        except Exception as err:  # one failing method must not hide the others' numbers
            report["methods"][method] = {"error": f"{type(err).__name__}: {err}"}
        print(method, json.dumps({k: v for k, v in report["methods"][method].items() if k != "settings"}), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(table(report))
    print(table(report))
    return report


if __name__ == "__main__":
    main()
