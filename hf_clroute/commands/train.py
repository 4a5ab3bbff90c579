"""`hf-clroute train`: one method over one suite's stream, checkpointed and resumable.

The installed package's way to train (``training/train_continual.py`` is a thin example
script over the same functions), on one process or under Accelerate:

    hf-clroute train --suite split-mnist --method finetune --output-dir runs/ft --checkpoint-every 50
    accelerate launch -m hf_clroute.cli train --config configs/runs/split-mnist-finetune.json
    hf-clroute train --config configs/runs/split-mnist-finetune.json --resume   # continue a stopped run

A run config is JSON: ``{"suite": <built-in name | suite JSON path | inline suite>, "method": <name>,
"seed": 0, "quick": false, "training": {TrainingConfig overrides}, "output_dir": "runs/...",
"from_adapter": <optional adapter dir or Hub repo id>}``; the command line's flags replace its
fields. Checkpoints go to ``<output_dir>/checkpoints`` (unless ``training.checkpoint_dir`` says
otherwise) at every task end and every ``checkpoint_every`` steps; the finished adapter to
``<output_dir>/adapter`` and the run's record (accuracy matrix, metrics, every setting and where it
came from) to ``<output_dir>/result.json``.

Resuming is explicit: ``resume="resume"`` continues from the latest checkpoint and refuses when
there is none or when it was written for another suite or other settings; ``"resume-or-start"``
starts fresh when there is none; ``"restart"`` removes the directory's checkpoints and starts
fresh; without any of them, a directory that already holds checkpoints is refused rather than
overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hf_clroute.bench.harness.settings import (
    RunSettings,
    describe_settings,
    resolve_run,
)
from hf_clroute.bench.harness.suites import SuiteConfig, suite_from_dict
from hf_clroute.bench.runners.classification import (
    adapter_method,
    run_method,
    summarize_result,
)
from hf_clroute.engine import make_accelerator
from hf_clroute.engine.checkpoint import LATEST, list_checkpoints, remove_checkpoints
from hf_clroute.errors import ResumeError, UserInputError
from hf_clroute.hub.io import atomic_write_text, read_json

#: the fields of a run config
RUN_CONFIG_FIELDS = ("suite", "method", "seed", "quick", "training", "output_dir", "from_adapter")
RESUME_MODES = (None, "resume", "resume-or-start", "restart")


def load_run_config(path: str | None, **flags: Any) -> dict[str, Any]:
    """A run config from ``path`` (or none), with the command line's ``flags`` (not None) on top,
    every field checked; ``"source"`` says where its training block came from."""
    config: dict[str, Any] = {}
    if path:
        config = read_json(path, "run config")
    where = f"run config {path}" if path else "the command line"
    unknown = sorted(set(config) - set(RUN_CONFIG_FIELDS))
    if unknown:
        raise UserInputError(f"{where} has unknown field(s) {unknown}; known: {list(RUN_CONFIG_FIELDS)}")
    config.update({k: v for k, v in flags.items() if v is not None})
    missing = [k for k in ("suite", "method", "output_dir") if k not in config]
    if missing:
        raise UserInputError(f"{where} is missing {', '.join(missing)} (give them in the run config or as "
                             f"--{' --'.join(m.replace('_', '-') for m in missing)})")
    for name, kind, what in (("method", str, "a method name"), ("output_dir", str, "a directory"),
                             ("seed", int, "an integer"), ("quick", bool, "true or false"),
                             ("training", dict, "an object of TrainingConfig fields")):
        value = config.get(name)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise UserInputError(f"{where}: field {name} must be {what}, got {value!r}")
    if config.get("from_adapter"):
        adapter_method(config["from_adapter"], [config["method"]])  # the adapter's method (or a variant of it)
    return {**config, "source": where}


def get_suite(config: dict[str, Any]) -> SuiteConfig:
    """The run config's suite: a name, a file, or an inline object; its ``quick`` version when asked."""
    suite = config["suite"]
    if isinstance(suite, dict):
        return suite_from_dict(SuiteConfig, suite, f"{config.get('source', 'run config')} (suite)",
                               quick=bool(config.get("quick")))
    if not isinstance(suite, str):
        raise UserInputError(f"{config.get('source', 'run config')}: field suite must be a suite name, a suite "
                             f"file or an object, got {suite!r}")
    return SuiteConfig.load(suite, quick=bool(config.get("quick")))


def run_settings(config: dict[str, Any], flags: dict[str, Any] | None = None) -> tuple[SuiteConfig, RunSettings, dict]:
    """(suite, resolved settings, ``run_method`` keywords) of a run config; ``flags`` are the command
    line's training values, which win over the run config's ``training`` block."""
    suite = get_suite(config)
    out = Path(config["output_dir"])
    overrides = {"checkpoint_dir": str(out / "checkpoints"), **config.get("training", {}), **(flags or {})}
    source = config.get("source", "run config")
    if flags and source != "the command line":
        source += ", then the command line"
    settings = resolve_run(suite, config["method"], config.get("seed", 0), overrides, overrides_source=source)
    return suite, settings, {"overrides_source": source, **overrides}


def resume_root(checkpoint_dir: str, mode: str | None) -> str | None:
    """The checkpoint root to resume from, or None to start fresh, by ``mode`` (see the module docstring)."""
    if mode not in RESUME_MODES:
        raise UserInputError(f"resume mode must be one of {RESUME_MODES}, got {mode!r}")
    root = Path(checkpoint_dir)
    found = root.is_dir() and (bool(list_checkpoints(root)) or (root / LATEST).is_file())
    if mode == "resume":
        if not found:
            raise ResumeError(f"--resume: no checkpoint under {root} (the run has not written one yet); run without "
                              "--resume to start it, or pass --resume-or-start to start when there is none")
        return str(root)
    if mode == "resume-or-start":
        return str(root) if found else None
    if found and mode != "restart":
        raise ResumeError(f"{root} already holds checkpoints of a run: pass --resume to continue it, or choose "
                          "another --output-dir, or pass --restart to remove them and start fresh")
    return None


def train(config: dict[str, Any], resume: str | None = None, flags: dict[str, Any] | None = None,
          show_settings: bool = False) -> dict[str, Any]:
    """Train (or, with ``show_settings``, only print the resolved settings of) one run config."""
    suite, settings, keywords = run_settings(config, flags)
    if show_settings:
        print(describe_settings(settings))
        return {"settings": settings.to_dict()}
    training = settings.training
    resume_from = resume_root(training.checkpoint_dir, resume) if training.checkpoint_dir else None
    if resume and not training.checkpoint_dir:
        raise UserInputError("--resume needs a checkpoint directory: training.checkpoint_dir is null")
    accelerator = make_accelerator(training)
    refuse_ignored_fsdp(accelerator)
    if resume == "restart" and accelerator.is_main_process and training.checkpoint_dir:
        remove_checkpoints(Path(training.checkpoint_dir))  # asked for by name: the old run's are not kept
    accelerator.wait_for_everyone()
    out = Path(config["output_dir"])
    result, model, settings = run_method(
        suite, config["method"], training.seed, accelerator=accelerator, resume_from=resume_from,
        from_adapter=config.get("from_adapter"), **keywords)
    report = {"suite": suite.name, "method": config["method"], "seed": training.seed,
              "from_adapter": config.get("from_adapter"), "resumed_from": resume_from,
              "num_processes": accelerator.num_processes, "finished": result.finished,
              "accuracy_matrix": result.accuracy_matrix, "untrained_accuracy": result.untrained_accuracy,
              "anytime": result.anytime, "params": result.params, "settings": settings.to_dict()}
    if result.finished:
        report["summary"] = summarize_result(result, suite.scenario)
    if accelerator.is_main_process:
        if result.finished:  # a stopped run's adapter is in its checkpoint, not published as finished
            model.save_pretrained(out / "adapter")
        atomic_write_text(out / "result.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(json.dumps({k: report[k] for k in ("method", "finished", "accuracy_matrix")}))
    accelerator.wait_for_everyone()
    return report


def refuse_ignored_fsdp(accelerator: Any) -> None:
    """Stop a launch that asked for FSDP (``ACCELERATE_USE_FSDP``, set by an FSDP config file) but got
    another kind of run: Accelerate shards only on accelerators and otherwise falls back to DDP
    silently, so a model that needs sharding would be replicated on every process."""
    from accelerate.utils import DistributedType

    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if asked and accelerator.distributed_type != DistributedType.FSDP:
        version = os.environ.get("FSDP_VERSION", "1")
        raise UserInputError(
            f"FSDP (fsdp_version {version}) was asked for, but Accelerate started a "
            f"{accelerator.distributed_type.value} run on {accelerator.device.type}: Accelerate shards models only "
            "on accelerators (GPU, NPU, XPU...), so here every process would hold the whole model. "
            "Launch on GPU machines, or drop the FSDP config "
            "(plain DDP: --multi_gpu, ACCELERATE_USE_CPU=1 on CPUs)")
