"""Speed where users feel it: the library's training loop against a bare PyTorch loop, the data pipeline, peak memory.

    python training/bench_speed.py --pairs 5 --out results/speed/speed.json [--quick]
    # writes the JSON (machine, date, commit, every measurement) and README.md beside it, prints the tables

* **Loop.** ``ContinualTrainer.fit`` (evaluation off: ``eval_every=0``) over the Split-MNIST stream of the
  ``split-mnist`` suite (its classes, order, ``train_per_class`` and batch size), against a hand-written loop with
  the same model forward, backward and AdamW step over the same batches collated beforehand (one AdamW per task, as
  the trainer builds; the method's task hooks run in both). The stream's test splits are cut to 2 examples per class
  and the time ``fit()`` spends evaluating (each task end's ``evaluate_row`` and the untrained-accuracy pass, timed
  around those two calls) is subtracted from its wall (and CPU) time: what is left is the training passes -- data
  reading, decoding, collation, steps -- and the per-task set-up. Library and bare runs alternate within each pair,
  their order rotating from pair to pair; the ratio is taken within a pair and the median over pairs reported.
  Families: fine-tuning (backbone trained), a frozen-backbone head (``finetune`` with ``freeze_backbone=True``: only
  the head trains, the frozen forward still runs), and a routing method (``rwf``). Variants of the library loop:
  ``png`` (the stream as ``build_stream`` gives it, PNG images decoded on every read: what a Python user who skips
  ``decode_stream`` runs), ``default`` (the stream the bench trains on: ``decode_stream_if_small``, images decoded
  once per seed, the same pixel values bit for bit; gradient clipping on, the TrainingConfig default) and
  ``no-clip`` (the default stream, clipping off). Each is compared with the bare loop doing the same work:
  ``bare, clip`` (clipping at the same norm) for the clipped variants, ``bare`` for ``no-clip``.
* **Pipeline.** Samples/s from the ``datasets`` stream to device-ready batches through the trainer's own loader
  (``training_loader``), with 0 and 2 workers: at the suite's size (28x28 gray PNGs) and at 224x224 RGB through a
  ViT-B/16-sized ``ViTImageProcessor`` (PNGs made in memory from MNIST digits upscaled to 224x224 RGB).
* **Memory.** Peak RSS (``VmHWM``; ``ru_maxrss`` recorded too) of a Split-MNIST fine-tuning run (the suite's
  settings, full test splits, anytime evaluation) and of the bare loop over the same batches, each in its own
  process, with the RSS after each import.

The backbone is the suite's ``pretrained-vit:vit-mnist-stream`` when it is cached, else a randomly initialised ViT
of the recipe's shape (speed and memory do not depend on the weights); the JSON says which.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUITE = "split-mnist"
RECIPE = "vit-mnist-stream"


def rss_mb() -> float:
    """Resident set size now (MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    """This process's peak RSS (MB): ``VmHWM``, the high-water mark of its own address space.

    ``ru_maxrss`` is also recorded, but a process spawned by a large one starts with the
    parent's RSS as its ``ru_maxrss`` (Linux carries it across ``exec``); ``VmHWM`` does not.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# --------------------------------------------------------------------------- set-up


def backbone_source() -> dict[str, Any]:
    """The suite's pretrained ViT when cached (never built here), else its recipe's shape, randomly initialised."""
    from hf_clroute.backbones.pretraining import vit as module
    from hf_clroute.backbones.pretraining.vit import pretrained_vit_path

    try:
        return {"kind": "pretrained", "path": pretrained_vit_path(RECIPE, build=False)}
    except FileNotFoundError:
        config = module.build_config(module.DEFAULTS, [str(i) for i in range(10)])
        return {"kind": "random-init", "recipe": RECIPE, "config": config.to_dict(),
                "image_size": module.IMAGE_SIZE, "mean": module.MEAN, "std": module.STD}


def make_backbone(source: dict[str, Any]):
    import torch
    from transformers import ViTConfig, ViTModel

    if source["kind"] == "pretrained":
        from hf_clroute.backbones.catalog import load_backbone

        return load_backbone(source["path"])[0]
    torch.manual_seed(0)
    return ViTModel(ViTConfig.from_dict(source["config"]))


def make_collator(source: dict[str, Any]):
    from transformers import ViTImageProcessor

    from hf_clroute.data import ImageCollator

    if source["kind"] == "pretrained":
        processor = ViTImageProcessor.from_pretrained(source["path"])
    else:  # the processor training/pretrain_vit.py saves with the checkpoint
        size = source["image_size"]
        processor = ViTImageProcessor(do_resize=True, size={"height": size, "width": size}, do_rescale=True,
                                      do_normalize=True, image_mean=[source["mean"]], image_std=[source["std"]])
    return ImageCollator.from_processor(processor)


def load_suite(train_per_class: int | None, test_per_class: int | None):
    from hf_clroute.bench.harness.suites import SuiteConfig

    suite = SuiteConfig.load(SUITE)
    return dataclasses.replace(suite, train_per_class=train_per_class or suite.train_per_class,
                               test_per_class=test_per_class or suite.test_per_class)


def family_settings(suite, family: str):
    """(adapter config, TrainingConfig) of a method family on the suite, as the bench resolves them."""
    from hf_clroute.bench.harness.settings import resolve_run

    method = {"finetune": "finetune", "frozen-head": "finetune", "rwf": "rwf"}[family]
    off = {"eval_every": 0, "evals_per_task": 0, "progress": False}  # no anytime evaluation
    settings = resolve_run(suite, method, 0, off)
    config = settings.adapter_config
    if family == "frozen-head":
        config = dataclasses.replace(config, freeze_backbone=True)
    return config, settings.training


# --------------------------------------------------------------------------- the loops


def library_loop(stream, collator, source, config, training) -> dict[str, float]:
    """``ContinualTrainer.fit`` samples/s over the training passes: fit's time minus the time in its
    evaluations (each task end's ``evaluate_row`` and the untrained-accuracy pass), wall and CPU."""
    from hf_clroute import ContinualTrainer, get_cl_model
    from hf_clroute.engine import make_accelerator

    model = get_cl_model(make_backbone(source), copy.deepcopy(config))
    trainer = ContinualTrainer(model, stream, training, collator, make_accelerator(training))
    spent = {"wall": 0.0, "cpu": 0.0}  # in evaluation: every task end's row and the untrained-accuracy pass

    def timed(method: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent["wall"] += time.perf_counter() - wall
                spent["cpu"] += time.process_time() - cpu
        return run

    trainer.evaluate_row = timed(trainer.evaluate_row)
    trainer._untrained_accuracy = timed(trainer._untrained_accuracy)
    cpu_started, started = time.process_time(), time.perf_counter()
    trainer.fit()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    samples = sum(len(e.train) for e in stream) * training.epochs
    seconds, cpu_seconds = wall - spent["wall"], cpu - spent["cpu"]
    return {"samples_per_s": samples / seconds, "cpu_samples_per_s": samples / cpu_seconds, "train_s": seconds,
            "train_cpu_s": cpu_seconds, "eval_s": spent["wall"], "eval_cpu_s": spent["cpu"], "wall_s": wall}


def old_collate(collator, examples):
    """``ImageCollator.__call__`` as it was: one ``to_tensor`` per image (the same numbers)."""
    import torch

    from hf_clroute.data.collate import batch_labels

    pixels = torch.stack([collator.to_tensor(ex[collator.image_column]) for ex in examples])
    return {"pixel_values": (pixels - collator.mean) / collator.std,
            "labels": batch_labels(examples, collator.label_column)}


def precollate(stream, collator, batch_size: int, device) -> list[list[dict]]:
    """Every task's training batches, collated once, in stream order, on the device."""
    out = []
    for e in stream:
        rows = list(e.train)
        out.append([{k: v.to(device) for k, v in collator(rows[i:i + batch_size]).items()}
                     for i in range(0, len(rows), batch_size)])
    return out


def bare_loop(stream, batches, source, config, training, device, clip: bool = False) -> dict[str, float]:
    """The hand-written loop: forward, backward, (clip,) AdamW step, zero_grad; a fresh AdamW per task."""
    import torch

    from hf_clroute import get_cl_model
    from hf_clroute.core.method import StepContext

    model = get_cl_model(make_backbone(source), copy.deepcopy(config)).to(device)
    model.train()
    samples = 0
    cpu_started, started = time.process_time(), time.perf_counter()
    for e, task_batches in zip(stream, batches, strict=True):
        model.grow_head(max(e.classes) + 1)
        model.begin_task(e, StepContext(e.task_id))
        params = model.trainable_parameters()
        optimizer = torch.optim.AdamW(params, lr=training.learning_rate, weight_decay=training.weight_decay)
        for batch in task_batches:
            out = model(**batch)
            out.loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, training.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            samples += batch["labels"].shape[0]
        model.end_task(e, StepContext(e.task_id))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {"samples_per_s": samples / seconds, "cpu_samples_per_s": samples / cpu_seconds, "train_s": seconds,
            "train_cpu_s": cpu_seconds}


#: family -> library variants; each is compared with the bare loop doing the same work
LOOP_VARIANTS = {"finetune": ["png", "default", "no-clip"], "frozen-head": ["png", "default", "no-clip"],
                 "rwf": ["default", "no-clip"]}


def measure_loops(args, source, suite, collator, device) -> dict[str, Any]:
    from hf_clroute.bench.harness.suites import build_stream
    from hf_clroute.data.collate import decode_stream_if_small

    png = build_stream(suite, 0)
    started = time.perf_counter()
    decoded = decode_stream_if_small(png, collator)
    decode_s = time.perf_counter() - started
    out: dict[str, Any] = {"decode_stream_s": decode_s, "families": {}}
    for family in args.families:
        config, training = family_settings(suite, family)
        batches = precollate(png, collator, training.batch_size, device)
        runs: dict[str, Callable[[], dict]] = {
            "bare": lambda b=batches, a=config, t=training: bare_loop(png, b, source, a, t, device),
            "bare, clip": lambda b=batches, a=config, t=training: bare_loop(png, b, source, a, t, device, clip=True)}
        reference = {}
        for name in LOOP_VARIANTS[family]:
            stream = png if name == "png" else decoded
            cfg = dataclasses.replace(training, max_grad_norm=0.0) if name == "no-clip" else training
            reference[name] = "bare" if name == "no-clip" else "bare, clip"
            runs[name] = lambda s=stream, a=config, c=cfg: library_loop(s, collator, source, a, c)
        library_loop(png, collator, source, config, training)  # warm-up: first-call costs, allocator, page cache
        names = list(runs)
        per_run: dict[str, list[dict]] = {n: [] for n in names}
        for pair in range(args.pairs):
            k = pair % len(names)
            for name in names[k:] + names[:k]:  # rotate the order from pair to pair
                per_run[name].append(runs[name]())
            print(f"  [{family}] pair {pair + 1}/{args.pairs}: " + ", ".join(
                f"{n} {per_run[n][-1]['samples_per_s']:.0f}/s" for n in names), flush=True)
        family_out = {"method": "rwf" if family == "rwf" else "finetune",
                      "adapter_config": config.to_dict(), "batch_size": training.batch_size,
                      "learning_rate": training.learning_rate, "max_grad_norm_default": training.max_grad_norm,
                      "train_samples": sum(len(e.train) for e in png), "runs": {}}
        for name in names:
            entry: dict[str, Any] = {"details": per_run[name]}
            if name in reference:
                entry["reference"] = reference[name]
            for clock in ("samples_per_s", "cpu_samples_per_s"):
                rates = [r[clock] for r in per_run[name]]
                entry |= {clock: rates, f"median_{clock}": statistics.median(rates)}
                if name in reference:  # the ratio within each pair to the bare loop doing the same work
                    prefix = "" if clock == "samples_per_s" else "cpu_"
                    bare = per_run[reference[name]]
                    ratios = [s / b[clock] for s, b in zip(rates, bare, strict=True)]
                    entry |= {f"{prefix}ratio": ratios, f"median_{prefix}ratio": statistics.median(ratios)}
            family_out["runs"][name] = entry
        out["families"][family] = family_out
    return out


def measure_gc(device) -> dict[str, Any]:
    """What the full ``free_memory()`` at each task end cost, against ``release_prepared``, in this process."""
    import torch
    from accelerate import Accelerator

    from hf_clroute.engine.trainer import release_prepared

    def timed(release: Callable) -> float:
        accelerator = Accelerator(cpu=device.type == "cpu")
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.AdamW(model.parameters())
        accelerator.prepare(model, optimizer)
        started = time.perf_counter()
        release(accelerator, optimizer)
        return time.perf_counter() - started

    objects = len(gc.get_objects())
    full = [timed(lambda a, o: a.free_memory()) for _ in range(3)]
    light = [timed(release_prepared) for _ in range(3)]
    return {"live_objects": objects, "free_memory_s": statistics.median(full),
            "release_prepared_s": statistics.median(light)}


# --------------------------------------------------------------------------- the pipeline


def png_dataset_224(n: int):
    """``n`` MNIST digits upscaled (bilinear) to 224x224 RGB, PNG-encoded in memory."""
    from datasets import ClassLabel, Dataset, Features, Image
    from PIL import Image as PILImage

    from hf_clroute.data import load_source

    mnist = load_source("mnist")["train"].select(range(n))
    images = []
    for example in mnist:
        image = example["image"].convert("RGB").resize((224, 224), resample=PILImage.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append({"bytes": buffer.getvalue(), "path": None})
    features = Features({"image": Image(), "label": ClassLabel(num_classes=10)})
    return Dataset.from_dict({"image": images, "label": list(mnist["label"])}, features=features)


def pipeline_rate(datasets_list, collator, batch_size: int, workers: int, device, *, old: bool = False) -> float:
    """Samples/s from the datasets' streams to device-ready batches, the trainer's loader per dataset."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader

    from hf_clroute.engine import TrainingConfig
    from hf_clroute.engine.batches import training_loader

    accelerator = Accelerator(cpu=device.type == "cpu", dataloader_config=DataLoaderConfiguration(split_batches=True))
    config = TrainingConfig(batch_size=batch_size, num_workers=workers, progress=False)
    samples = 0
    started = time.perf_counter()
    for ds in datasets_list:
        data = ds.to_iterable_dataset(num_shards=1)
        if old:  # the loader as it was: rows one by one, images collated one by one
            loader = accelerator.prepare_data_loader(DataLoader(
                data, batch_size=batch_size, collate_fn=lambda ex: old_collate(collator, ex), num_workers=workers))
        else:
            loader = training_loader(data, collator, config, accelerator)
        for batch in loader:
            samples += batch["labels"].shape[0]
    return samples / (time.perf_counter() - started)


def measure_pipeline(args, suite, collator, device) -> dict[str, Any]:
    from transformers import ViTImageProcessor

    from hf_clroute.bench.harness.suites import build_stream
    from hf_clroute.data import ImageCollator
    from hf_clroute.data.collate import decode_images

    out: dict[str, Any] = {}
    gray = [e.train for e in build_stream(suite, 0)]
    processor = ViTImageProcessor(size={"height": 224, "width": 224}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    vit_b16 = ImageCollator.from_processor(processor)
    started = time.perf_counter()
    rgb = [png_dataset_224(args.rgb_images)]
    make_s = time.perf_counter() - started
    cases = {"28x28 gray (suite)": (gray, collator, 10), "224x224 RGB (ViT-B/16 processor)": (rgb, vit_b16, 32)}
    for label, (dsets, coll, batch_size) in cases.items():
        started = time.perf_counter()
        decoded = [decode_images(ds, coll) for ds in dsets]
        decode_s = time.perf_counter() - started
        case = {"examples": sum(len(d) for d in dsets), "batch_size": batch_size, "decode_images_s": decode_s,
                "samples_per_s": {}}
        if label.startswith("224"):
            case["png_build_s"] = make_s
            case["collator"] = {"size": list(coll.size), "num_channels": coll.num_channels,
                                "mean": coll.mean.flatten().tolist(), "std": coll.std.flatten().tolist()}
        for name, data, old in (("before (row reads, per-image collate)", dsets, True), ("PNG", dsets, False),
                                ("decoded", decoded, False)):
            for workers in (0, 2):
                rates = [pipeline_rate(data, coll, batch_size, workers, device, old=old)
                         for _ in range(args.pipeline_reps)]
                case["samples_per_s"][f"{name}, {workers} workers"] = statistics.median(rates)
                print(f"  [pipeline {label}] {name}, {workers} workers: {statistics.median(rates):.0f}/s", flush=True)
        out[label] = case
    return out


# --------------------------------------------------------------------------- memory (own processes)


def memory_child(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh process: RSS after each import, then the whole run's peak."""
    stages = {"python": rss_mb()}
    import torch

    stages["import torch"] = rss_mb()
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    from transformers import ViTConfig, ViTModel

    stages["+ transformers ViTModel"] = rss_mb()
    if kind.startswith("bare"):
        if kind == "bare + import datasets":  # what any loop over a `datasets` stream imports
            import datasets  # noqa: F401

            stages["+ import datasets"] = rss_mb()
        data = torch.load(spec["batches"])
        stages["+ batches loaded"] = rss_mb()
        source = spec["source"]
        torch.manual_seed(0)
        backbone = (ViTModel.from_pretrained(source["path"]) if source["kind"] == "pretrained"
                    else ViTModel(ViTConfig.from_dict(source["config"])))
        head = torch.nn.Linear(backbone.config.hidden_size, 10)
        params = [*backbone.parameters(), *head.parameters()]
        for task in data["tasks"]:
            optimizer = torch.optim.AdamW(params, lr=spec["learning_rate"])
            backbone.train()
            for x, y in task:
                loss = torch.nn.functional.cross_entropy(head(backbone(pixel_values=x).pooler_output), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            backbone.eval()
            with torch.no_grad():
                for x, y in data["test"]:
                    head(backbone(pixel_values=x).pooler_output).argmax(-1).eq(y).sum().item()
        stages["after the run"] = rss_mb()
        return {"stages_mb": stages, "peak_rss_mb": peak_rss_mb(),
                "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    import hf_clroute  # noqa: F401

    stages["+ import hf_clroute"] = rss_mb()
    from hf_clroute import ContinualTrainer, get_cl_model
    from hf_clroute.engine import make_accelerator

    stages["+ ContinualTrainer, get_cl_model"] = rss_mb()
    from hf_clroute.bench.harness.settings import resolve_run
    from hf_clroute.bench.harness.suites import build_stream

    stages["+ hf_clroute.bench"] = rss_mb()
    from hf_clroute.data.collate import decode_stream_if_small

    suite = load_suite(spec["train_per_class"], spec["test_per_class"])
    collator = make_collator(spec["source"])
    stream = decode_stream_if_small(build_stream(suite, 0), collator)  # the stream the bench trains on
    stages["+ stream built"] = rss_mb()
    settings = resolve_run(suite, "finetune", 0, {"progress": False})
    source = spec["source"]
    model = get_cl_model(make_backbone(source), settings.adapter_config)
    trainer = ContinualTrainer(model, stream, settings.training, collator, make_accelerator(settings.training))
    result = trainer.fit()
    stages["after the run"] = rss_mb()
    return {"stages_mb": stages, "peak_rss_mb": peak_rss_mb(),
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "accuracy_matrix": result.accuracy_matrix,
            "training": dataclasses.asdict(settings.training)}


def measure_memory(args, source, collator) -> dict[str, Any]:
    import torch

    from hf_clroute.bench.harness.suites import build_stream

    suite = load_suite(None, None)  # the suite's own sizes, quick or not
    stream = build_stream(suite, 0)
    _, training = family_settings(suite, "finetune")
    out: dict[str, Any] = {"train_per_class": suite.train_per_class, "test_per_class": suite.test_per_class}
    with tempfile.TemporaryDirectory() as tmp:
        batches = Path(tmp) / "batches.pt"
        tasks = []
        for e in stream:
            rows = list(e.train)
            tasks.append([tuple(collator(rows[i:i + training.batch_size]).values())
                          for i in range(0, len(rows), training.batch_size)])
        test_rows = [r for e in stream for r in e.test]
        test = [tuple(collator(test_rows[i:i + 256]).values()) for i in range(0, len(test_rows), 256)]
        torch.save({"tasks": tasks, "test": test}, batches)
        spec = {"source": source, "batches": str(batches), "learning_rate": training.learning_rate,
                "train_per_class": suite.train_per_class, "test_per_class": suite.test_per_class,
                "threads": args.threads}
        for kind in ("library", "bare", "bare + import datasets"):
            proc = subprocess.run([sys.executable, __file__, "--memory-child", kind, "--spec", json.dumps(spec)],
                                  capture_output=True, text=True, cwd=REPO, check=False)
            if proc.returncode:
                raise RuntimeError(f"memory child {kind} failed:\n{proc.stderr[-3000:]}")
            out[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["peak_ratio"] = out["library"]["peak_rss_mb"] / out["bare"]["peak_rss_mb"]
    out["peak_ratio_to_bare_with_datasets"] = (out["library"]["peak_rss_mb"]
                                               / out["bare + import datasets"]["peak_rss_mb"])
    return out


# --------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "cpu": cpu,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available(), "platform": platform.platform()}


def commit() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=REPO, check=False).stdout.strip()

    return {"sha": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def tables(results: dict[str, Any]) -> str:
    lines = ["| family | loop | samples/s (wall) | compared with | library / bare (wall) | library / bare (CPU time) |",
             "|---|---|---|---|---|---|"]
    for family, f in results["loop"]["families"].items():
        for name, run in f["runs"].items():
            if "reference" not in run:
                lines.append(f"| {family} | *{name} loop* | {run['median_samples_per_s']:.0f} | | | |")
                continue
            lines.append(f"| {family} | {name} | {run['median_samples_per_s']:.0f} | {run['reference']} | "
                         f"{run['median_ratio']:.3f}x | {run['median_cpu_ratio']:.3f}x |")
    out = "\n".join(lines) + "\n"
    pipe = ["| images | path | 0 workers | 2 workers |", "|---|---|---|---|"]
    for label, case in results["pipeline"].items():
        names = list(dict.fromkeys(k.rsplit(",", 1)[0] for k in case["samples_per_s"]))
        for name in names:
            rates = case["samples_per_s"]
            pipe.append(f"| {label} | {name} | {rates[f'{name}, 0 workers']:.0f} | {rates[f'{name}, 2 workers']:.0f} |")
    out += "\nData pipeline alone (samples/s, stream to device-ready batches):\n\n" + "\n".join(pipe) + "\n"
    mem = results["memory"]
    rows = ["| process | peak RSS (MB) |", "|---|---|"]
    rows.append(f"| library: Split-MNIST fine-tuning run | {mem['library']['peak_rss_mb']:.0f} |")
    rows.append(f"| bare loop, same batches | {mem['bare']['peak_rss_mb']:.0f} |")
    with_datasets = mem["bare + import datasets"]["peak_rss_mb"]
    rows.append(f"| bare loop, same batches, `import datasets` first | {with_datasets:.0f} |")
    rows.append(f"| library / bare | {mem['peak_ratio']:.2f}x |")
    rows.append(f"| library / (bare + import datasets) | {mem['peak_ratio_to_bare_with_datasets']:.2f}x |")
    out += "\nPeak memory (own processes):\n\n" + "\n".join(rows) + "\n"
    stages = ["| after | library RSS (MB) | bare RSS (MB) | bare + import datasets RSS (MB) |", "|---|---|---|---|"]
    lib, bare, with_ds = (mem[k]["stages_mb"] for k in ("library", "bare", "bare + import datasets"))
    for stage in dict.fromkeys([*lib, *bare, *with_ds]):
        cells = (f"{d.get(stage, float('nan')):.0f}" for d in (lib, bare, with_ds))
        stages.append(f"| {stage} | " + " | ".join(cells) + " |")
    out += "\n" + "\n".join(stages) + "\n"
    return out


def targets(results: dict[str, Any]) -> dict[str, Any]:
    fam = results["loop"]["families"]
    out = {}
    for family in ("finetune", "frozen-head"):
        if family in fam:
            runs = fam[family]["runs"]
            out[f"{family} loop >= 0.95x bare"] = {
                name: {"ratio": run["median_ratio"], "cpu_ratio": run["median_cpu_ratio"],
                       "compared_with": run["reference"], "met": run["median_ratio"] >= 0.95,
                       "met_cpu": run["median_cpu_ratio"] >= 0.95}
                for name, run in runs.items() if "reference" in run}
    mem = results["memory"]
    out["peak memory <= 1.2x bare"] = {"ratio": mem["peak_ratio"], "met": mem["peak_ratio"] <= 1.2}
    out["peak memory <= 1.2x bare + import datasets (not the issue's target)"] = {
        "ratio": mem["peak_ratio_to_bare_with_datasets"], "met": mem["peak_ratio_to_bare_with_datasets"] <= 1.2}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/speed/speed.json")
    parser.add_argument("--pairs", type=int, default=5, help="library/bare pairs per family (median ratio)")
    parser.add_argument("--quick", action="store_true",
                        help="200 training examples per class (not 500) and 200 224x224 images (not 640) for the "
                             "loop and pipeline timings; the memory runs keep the suite's sizes")
    parser.add_argument("--families", default="finetune,frozen-head,rwf")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from the JSON at --out")
    parser.add_argument("--memory-child", choices=["library", "bare", "bare + import datasets"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:  # before anything imports torch: the child measures its imports
        print(json.dumps(memory_child(args.memory_child, json.loads(args.spec))))
        return
    if args.readme_only:
        results = json.loads(Path(args.out).read_text())
        (Path(args.out).parent / "README.md").write_text(readme(results, tables(results), Path(args.out).parent))
        return
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    args.families = args.families.split(",")
    args.train_per_class = 200 if args.quick else None  # None: the suite's own
    args.rgb_images = 200 if args.quick else 640
    args.pipeline_reps = 3
    started = time.perf_counter()
    load_start = os.getloadavg()

    import torch

    from hf_clroute.engine import TrainingConfig, make_accelerator

    device = make_accelerator(TrainingConfig()).device
    source = backbone_source()
    collator = make_collator(source)
    suite = load_suite(args.train_per_class, 2)  # 2 test examples per class: evaluation is not what is timed
    print(f"backbone: {source['kind']}; device {device}; {torch.get_num_threads()} torch threads", flush=True)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "quick": args.quick,
        "backbone": {k: v for k, v in source.items() if k != "path"} | {"suite_backbone": f"pretrained-vit:{RECIPE}"},
        "suite": SUITE,
        "train_per_class": suite.train_per_class,
        "loop_test_per_class": suite.test_per_class,
        "pairs": args.pairs,
        "timing": "library: ContinualTrainer.fit wall/CPU time minus the time inside its evaluate_row and "
                  "_untrained_accuracy calls, eval_every=0 (and evals_per_task=0), 2 test examples per class; "
                  "bare: the loop over batches collated beforehand. "
                  "Runs alternate within a pair, order rotated per pair; ratios within pairs, median over pairs.",
    }
    results["loop"] = measure_loops(args, source, suite, collator, device)
    results["gc"] = measure_gc(device)
    ft = results["loop"]["families"].get("finetune")
    if ft:
        results["gc"]["tasks"] = 5
        results["gc"]["share_of_default_finetune_loop"] = (
            5 * results["gc"]["free_memory_s"] / statistics.median(r["train_s"] for r in ft["runs"]["png"]["details"]))
    results["pipeline"] = measure_pipeline(args, load_suite(args.train_per_class, None), collator, device)
    results["memory"] = measure_memory(args, source, collator)
    results["targets"] = targets(results)
    results["load_average"] = {"start": load_start, "end": os.getloadavg()}
    results["wall_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = tables(results)
    (out.parent / "README.md").write_text(readme(results, table, out.parent))
    print(table)
    print(json.dumps(results["targets"], indent=2))
    print(f"wrote {out} and {out.parent / 'README.md'} in {results['wall_s']:.0f}s")


def same_numbers_note(out_dir: Path) -> str:
    """What ``scripts/same-numbers/before_after.sh`` found, from its comparison JSON beside the results."""
    path = out_dir / "before_after_split-mnist.json"
    if not path.exists():
        return ""
    comparison = json.loads(path.read_text())
    methods = comparison["methods"]
    same = [m for m, row in methods.items() if row["same"]]
    return (f"\nSame numbers: `scripts/same-numbers/before_after.sh {comparison['revision_before']} split-mnist "
            f"{','.join(methods)}` ran those bench rows (seed 0) with the code of {comparison['revision_before']} and "
            f"with this code: {len(same)} of {len(methods)} have identical accuracy matrices, anytime curves and "
            f"probes ([before_after_split-mnist.json](before_after_split-mnist.json)).\n")


def readme(results: dict[str, Any], table: str, out_dir: Path) -> str:
    m, gcm = results["machine"], results["gc"]
    threads_note = (" (set with --threads: on a shared 2-core machine two torch threads wait on each other whenever "
                    "another job holds a core, and timings swing several-fold)"
                    if "--threads" in results["command"] else "")
    mem = results["memory"]
    sizes = ("--quick sizes: 200 training examples per class instead of the suite's 500, 200 images at 224x224; "
             "the memory runs keep the suite sizes" if results["quick"] else "the suite sizes")
    backbone = ("the cached `pretrained-vit:vit-mnist-stream`" if results["backbone"]["kind"] == "pretrained" else
                "a randomly initialised ViT of the `vit-mnist-stream` recipe's shape "
                "(the pretrained one was not cached)")
    met = []
    for name, value in results["targets"].items():
        if "ratio" in value:
            met.append(f"- {name}: {value['ratio']:.2f}x, {'met' if value['met'] else 'not met'}")
        else:
            met.extend(f"- {name}, {variant}: {v['ratio']:.3f}x wall ({'met' if v['met'] else 'not met'}), "
                       f"{v['cpu_ratio']:.3f}x CPU time ({'met' if v['met_cpu'] else 'not met'})"
                       for variant, v in value.items())
    return f"""# Speed: the training loop against a bare PyTorch loop

`{results['command']}` ({sizes}), {results['date']},
commit `{results['commit']['sha'][:10]}`{' + uncommitted changes' if results['commit']['dirty'] else ''},
{m['cores']} cores ({m['cpu']}), {m['torch_threads']} torch thread(s){threads_note}, load average
{results['load_average']['start'][0]:.1f} at the start and {results['load_average']['end'][0]:.1f} at the end
(a shared machine: absolute numbers are noisy, ratios within a pair less so). Wall time {results['wall_s']:.0f} s.
Everything measured is in [speed.json](speed.json); `training/bench_speed.py` says how.

Split-MNIST stream of the `{results['suite']}` suite ({results['train_per_class']} training examples per class,
5 tasks), batch size 10, on {backbone}.
Library: `ContinualTrainer.fit` with anytime evaluation off, timed as fit's time minus the time inside its
evaluations (task-end rows, untrained accuracy), over test splits cut to {results['loop_test_per_class']} examples
per class. Bare: forward, backward, AdamW step over the same batches collated beforehand.
{results['pairs']} interleaved pairs, median ratio, in wall time and in this process's CPU time
(`time.process_time`, evaluation's share subtracted likewise; with no DataLoader workers all the work is in
the process, and CPU time is what a busy shared machine disturbs least).

{table}
`png` trains on the suite's stream as `build_stream` gives it (PNG images, decoded at every read); `default`
on the stream the bench trains on, whose images `decode_stream_if_small` decoded once per seed
({results['loop']['decode_stream_s']:.1f} s for the whole stream, paid once for every method, evaluation and probe
of that seed; the pixel values are bit-identical to the PNG path), with gradient clipping on (the default: it
changes numbers); `no-clip` is the default stream with clipping off. Each variant is compared, pair by pair, with
the bare loop doing the same work (`compared with`).

Task ends: `Accelerator.free_memory()` took {gcm['free_memory_s'] * 1000:.0f} ms with {gcm['live_objects']:,} live
objects in this process (x5 tasks = {gcm.get('share_of_default_finetune_loop', 0) * 100:.1f}% of the `png`
fine-tuning loop); `release_prepared`, which replaces it, {gcm['release_prepared_s'] * 1000:.2f} ms.

Targets:

{chr(10).join(met)}

Memory: peak RSS is the process's `VmHWM` (its `ru_maxrss` is also in the JSON, but a process spawned by a
large one inherits the parent's `ru_maxrss`). The bare process imports torch and transformers only
({mem['bare']['stages_mb']['+ transformers ViTModel']:.0f} MB before any data); the library's process reaches
{mem['library']['stages_mb']['+ ContinualTrainer, get_cl_model']:.0f} MB once `from hf_clroute import ContinualTrainer`
has pulled in accelerate and datasets, {mem['library']['stages_mb']['+ stream built']:.0f} MB with the stream built
(memory-mapped Arrow tables of MNIST, this stream's images decoded), and peaks at
{mem['library']['peak_rss_mb']:.0f} MB against the bare loop's {mem['bare']['peak_rss_mb']:.0f} MB
({mem['peak_ratio']:.2f}x). `import hf_clroute` alone is lazy.
Importing `datasets` (pyarrow and pandas with it), which any loop over a `datasets` stream does, takes the bare
process from {mem['bare + import datasets']['stages_mb']['+ transformers ViTModel']:.0f} to
{mem['bare + import datasets']['stages_mb']['+ import datasets']:.0f} MB; against that bare loop the library's peak is
{mem['peak_ratio_to_bare_with_datasets']:.2f}x: the rest of the gap is the library's own.

DataLoader workers: `TrainingConfig.num_workers=-1` (the default) means min(4, cores - 1) on a machine with more
than 2 cores, else 0; on this {m['usable_cores']}-core machine that is
{min(4, m['usable_cores'] - 1) if m['usable_cores'] > 2 else 0}. Batches and their order do not depend on it.
{same_numbers_note(out_dir)}"""


if __name__ == "__main__":
    main()
