"""RwF cost against the bare backbone: trainable share, inference and training time.

    python training/rwf_overhead.py [--backbone vit-b16|minilm|PATH] [--batch 8] [--reps 5] [--out overhead.json]

Inference: the frozen backbone's pooled features + a linear head (what the
nearest-class-mean / linear-probe baselines run) vs the same with RwF at its
default config. Training: one optimiser step of the head alone on frozen
features vs one RwF step (queries + head; the gradient must flow back through
every block above the first routed one). Timings interleave the two models and
take medians, so load from other processes hits both alike; the FLOP ratio of
one inference forward (``torch.utils.flop_counter``) is reported beside them,
as a number no machine load can move. Weights are random
for ``vit-b16`` (cost depends on the architecture, not the weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import ViTConfig, ViTModel

from hf_clroute import get_cl_model
from hf_clroute.backbones.catalog import get_backbone_spec, load_backbone
from hf_clroute.baselines import FinetuneConfig
from hf_clroute.bench.harness.flops import count_flops
from hf_clroute.bench.harness.suites import resolve_backbone_path
from hf_clroute.hub.io import atomic_write_text
from hf_clroute.methods.rwf import RwfConfig


def build(name: str) -> tuple[Callable[[], torch.nn.Module], dict[str, torch.Tensor]]:
    """A backbone factory and one input batch of size 1 (expanded later)."""
    if name == "vit-b16":
        config = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, image_size=224, patch_size=16)

        def make() -> torch.nn.Module:
            torch.manual_seed(0)
            return ViTModel(config)

        return make, {"pixel_values": torch.randn(1, 3, 224, 224)}
    path = resolve_backbone_path(name)
    model, processor = load_backbone(path)
    if get_backbone_spec(model).modality == "text":
        text = "a tall perennial woody plant having a main trunk and branches forming a distinct elevated crown"
        inputs = dict(processor([text], padding="max_length", max_length=32, truncation=True, return_tensors="pt"))
    else:
        size = model.config.image_size
        inputs = {"pixel_values": torch.randn(1, model.config.num_channels, size, size)}
    return (lambda: load_backbone(path)[0]), inputs


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, batch: int, reps: int, num_classes: int = 10) -> dict:
    make, one = build(name)
    inputs = {k: v.expand(batch, *v.shape[1:]).contiguous() for k, v in one.items()}
    labels = torch.arange(batch) % num_classes
    bare = get_cl_model(make(), FinetuneConfig(freeze_backbone=True))  # frozen backbone + linear head
    rwf = get_cl_model(make(), RwfConfig())
    for model in (bare, rwf):
        model.grow_head(num_classes)
        model.eval()  # no dropout: the same work in every repetition

    def infer(model):
        with torch.inference_mode():
            model(**inputs)

    # One optimiser per model, built outside the timed steps (its state is set up in the warm-up round).
    optimizers = {id(m): torch.optim.AdamW(m.trainable_parameters(), lr=1e-3) for m in (bare, rwf)}

    def train(model):
        optimizer = optimizers[id(model)]
        loss = torch.nn.functional.cross_entropy(model(**inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {k: [] for k in ("infer_bare", "infer_rwf", "train_bare", "train_rwf")}
    for step in range(reps + 1):  # the first round warms up allocators and kernels
        for key, fn, model in (("infer_bare", infer, bare), ("infer_rwf", infer, rwf),
                               ("train_bare", train, bare), ("train_rwf", train, rwf)):
            seconds = timed(lambda: fn(model))
            if step:
                times[key].append(seconds)
    median = {k: statistics.median(v) for k, v in times.items()}
    flops = {"bare": count_flops(bare, **inputs), "rwf": count_flops(rwf, **inputs)}
    counts = rwf.parameter_counts()
    return {
        "backbone": name,
        "batch": batch,
        "reps": reps,
        "rwf_config": {k: v for k, v in RwfConfig().to_dict().items() if k not in ("base_model_name_or_path",)},
        "trainable_params": counts["trainable_params"],
        "backbone_params": counts["backbone_params"],
        "trainable_pct": round(counts["trainable_pct"], 3),
        "infer_samples_per_s": {"bare": batch / median["infer_bare"], "rwf": batch / median["infer_rwf"]},
        "train_samples_per_s": {"bare_head_only": batch / median["train_bare"], "rwf": batch / median["train_rwf"]},
        "inference_overhead": median["infer_rwf"] / median["infer_bare"],
        "inference_flops_ratio": flops["rwf"] / flops["bare"],
        "training_overhead": median["train_rwf"] / median["train_bare"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", action="append",
                        help="vit-b16, minilm, pretrained-vit:<recipe> or a checkpoint dir (repeatable)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    results = [measure(name, args.batch, args.reps) for name in (args.backbone or ["vit-b16"])]
    for r in results:
        print(
            f"{r['backbone']}: trainable {r['trainable_pct']:.2f}% | inference x{r['inference_overhead']:.2f} "
            f"(FLOPs x{r['inference_flops_ratio']:.3f}) "
            f"({r['infer_samples_per_s']['bare']:.1f} -> {r['infer_samples_per_s']['rwf']:.1f}/s) | "
            f"training x{r['training_overhead']:.2f} vs head-only"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.out), json.dumps(results, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
