"""Train one continual method over one suite's stream, under `accelerate launch`.

    accelerate launch training/train_continual.py --config configs/runs/split-mnist-finetune.json

Two CPU processes on one machine (SPEC 8):

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no training/train_continual.py --config ...

The run config is JSON: {"suite": <built-in name | suite JSON path | inline suite>,
"method": <name>, "seed": 0, "quick": false, "training": {TrainingConfig overrides},
"output_dir": "runs/...", "from_adapter": <optional adapter dir or Hub repo id>}.
With "from_adapter" the run continues that adapter on the suite's stream (classes it
knows keep their ids, new ones come after them; "method" must be the adapter's).
Checkpoints go to <output_dir>/checkpoints; pass --resume to continue a stopped run
from its latest checkpoint.

Several machines and sharded models: configs/accelerate/two-nodes.yaml, configs/accelerate/fsdp2.yaml
and README "Scaling out".
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from accelerate.utils import DistributedType

from hf_clroute.bench.classification import adapter_method, run_method, summarize_result
from hf_clroute.bench.settings import resolve_run
from hf_clroute.engine import make_accelerator
from hf_clroute.io import atomic_write_text
from hf_clroute.bench.suites import SuiteConfig


#: the fields of a run config
RUN_CONFIG_FIELDS = ("suite", "method", "seed", "quick", "training", "output_dir", "from_adapter")


def load_run_config(path: str) -> dict:
    config = json.loads(Path(path).read_text())
    missing = [k for k in ("suite", "method", "output_dir") if k not in config]
    if missing:
        raise ValueError(f"run config {path} is missing field(s) {missing}")
    unknown = sorted(set(config) - set(RUN_CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"run config {path} has unknown field(s) {unknown}; known: {list(RUN_CONFIG_FIELDS)}")
    if config.get("from_adapter"):
        adapter_method(config["from_adapter"], [config["method"]])  # the adapter's method (or a variant of it)
    return config


def get_suite(config: dict) -> SuiteConfig:
    suite = config["suite"]
    suite = SuiteConfig(**suite) if isinstance(suite, dict) else SuiteConfig.load(suite)
    return suite.quick_version() if config.get("quick") else suite


def refuse_ignored_fsdp(accelerator) -> None:
    """Stop a launch that asked for FSDP (``ACCELERATE_USE_FSDP``, set by an FSDP config file) but got
    another kind of run: Accelerate shards only on accelerators and otherwise falls back to DDP
    silently, so a model that needs sharding would be replicated on every process."""
    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if asked and accelerator.distributed_type != DistributedType.FSDP:
        version = os.environ.get("FSDP_VERSION", "1")
        raise SystemExit(
            f"FSDP (fsdp_version {version}) was asked for, but Accelerate started a {accelerator.distributed_type.value} "
            f"run on {accelerator.device.type}: Accelerate shards models only on accelerators (GPU, NPU, XPU...), "
            "so here every process would hold the whole model. Launch on GPU machines, or drop the FSDP config "
            "(plain DDP: --multi_gpu, ACCELERATE_USE_CPU=1 on CPUs)")


def training_function(config: dict, args: argparse.Namespace) -> dict:
    suite = get_suite(config)
    out = Path(config["output_dir"])
    overrides = {"checkpoint_dir": str(out / "checkpoints"), **config.get("training", {})}
    if args.stop_after_steps:
        overrides["stop_after_steps"] = args.stop_after_steps
    training = resolve_run(suite, config["method"], config.get("seed", 0), overrides).training
    accelerator = make_accelerator(training)
    refuse_ignored_fsdp(accelerator)
    resume = str(out / "checkpoints") if args.resume else None
    result, model, settings = run_method(
        suite, config["method"], training.seed, accelerator=accelerator, resume_from=resume,
        from_adapter=config.get("from_adapter"), **overrides
    )
    report = {"suite": suite.name, "method": config["method"], "seed": training.seed,
              "from_adapter": config.get("from_adapter"),
              "num_processes": accelerator.num_processes, "finished": result.finished,
              "accuracy_matrix": result.accuracy_matrix, "untrained_accuracy": result.untrained_accuracy,
              "anytime": result.anytime, "params": result.params, "settings": settings.to_dict()}
    if result.finished:
        report["summary"] = summarize_result(result, suite.scenario)
    if accelerator.is_main_process:
        model.save_pretrained(out / "adapter")
        atomic_write_text(out / "result.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(json.dumps({k: report[k] for k in ("method", "finished", "accuracy_matrix")}))
    accelerator.wait_for_everyone()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="run config JSON")
    parser.add_argument("--resume", action="store_true", help="continue from <output_dir>/checkpoints/latest")
    parser.add_argument("--stop-after-steps", type=int, default=0, help="stop (resumably) after N global steps")
    args = parser.parse_args()
    training_function(load_run_config(args.config), args)


if __name__ == "__main__":
    main()
