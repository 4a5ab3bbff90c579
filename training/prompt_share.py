"""RwF's parameter share beside the prompt methods', counted on a ViT-B/16-shaped backbone.

    python training/prompt_share.py [--tasks 10] [--classes 200] [--out results/prompt-share.json]

Each method at its method file's settings (``hf_clroute/bench/configs/methods/<method>.json``, the
tables' defaults) on a randomly initialised ViT-B/16 (a count depends on the shape, not the
weights), for a stream of ``--tasks`` tasks over ``--classes`` classes (Split-ImageNet-R: 10 x 20).
Every task is started the way the trainer starts it, so a method that grows per task (CODA-Prompt's
components) holds the whole stream's parameters. Two counts per method, as % of the backbone's
parameters, the linear head left out (every method here shares it, 768 x classes):

* ``added_pct``: everything the method adds to the backbone by the end of the stream, whether it
  still trains or was frozen at an earlier task's end (how papers count a method's size);
* ``trainable_pct``: what trains during the last task.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import ViTConfig, ViTModel

from hf_clroute import get_cl_model
from hf_clroute.bench.harness.settings import merged_method_settings, registered_method
from hf_clroute.core.method import StepContext
from hf_clroute.core.registry import get_method
from hf_clroute.hub.io import atomic_write_text

METHODS = ("rwf", "l2p", "dualprompt", "coda-prompt")


def vit_b16() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, image_size=224,
                              patch_size=16))


def count(method: str, tasks: int, classes: int) -> dict:
    entry = get_method(registered_method(method))
    config = entry.config_class(**merged_method_settings(method, [])["config"])
    model = get_cl_model(vit_b16(), config)
    model.grow_head(classes)
    model.method.check_stream(tasks)
    for task in range(tasks):  # what the trainer does at each task start and end
        ctx = StepContext(task_id=task)
        model.method.on_task_start(model, SimpleNamespace(name=f"task{task}"), ctx)
        if task < tasks - 1:
            model.method.on_task_end(model, SimpleNamespace(name=f"task{task}"), ctx)
    original = model.backbone_parameters()  # not backbone.parameters(): a method may add modules inside it
    backbone = sum(p.numel() for p in original)
    owned = {id(p) for p in original} | {id(p) for p in model.head.parameters()}
    added = sum(p.numel() for p in model.parameters() if id(p) not in owned)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in owned)
    return {"method": method, "added_params": added, "trainable_params": trainable, "backbone_params": backbone,
            "added_pct": round(100 * added / backbone, 3), "trainable_pct": round(100 * trainable / backbone, 3),
            "config": {k: v for k, v in config.to_dict().items() if k != "base_model_name_or_path"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", help="also write the counts as JSON here")
    args = parser.parse_args()
    rows = [count(m, args.tasks, args.classes) for m in args.methods.split(",")]
    for r in rows:
        print(f"{r['method']:12s} added {r['added_pct']:6.2f}%  trainable in the last task {r['trainable_pct']:6.2f}%")
    if args.out:
        result = {"backbone": "vit-b16", "tasks": args.tasks, "classes": args.classes,
                  "methods": {r["method"]: r for r in rows}}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.out), json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
