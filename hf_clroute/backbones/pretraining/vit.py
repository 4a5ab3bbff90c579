"""The stand-in ViT backbones' pretraining: a small ViT in CPU minutes.

No pretrained ViT can be downloaded on these machines, and a ViT trained only on
a *different* small dataset transfers poorly (a small Fashion-MNIST ViT reads MNIST
badly when frozen). A web-pretrained backbone has seen images *like* the benchmark's,
without their benchmark labels. :func:`training_function` imitates that, per recipe
(:data:`hf_clroute.backbones.pretraining.recipes.RECIPES`):

* supervised cross-entropy on a labelled **source** dataset (the classifier head
  saved with the checkpoint, ``id2label`` = the source's classes), plus
* SimCLR's NT-Xent contrastive loss on two augmented views of the **unlabelled**
  training images of the **target** stream's dataset (a recipe may have none: the
  Split-MNIST-R backbone never sees a digit). Its labels are dropped before the images
  are even read (``load_images(..., with_labels=False)``) and the target loader yields
  only ``pixel_values``.

Both losses share ONE backbone pass per step (source batch and both target views
concatenated): bigger matrix products are what a 2-core CPU does best.

The result is a normal transformers checkpoint (``ViTForImageClassification`` +
``ViTImageProcessor``) plus ``pretrain_report.json`` with the objective, steps,
wall time, source test accuracy and the frozen CLS features' nearest-class-mean
and linear-probe accuracy on the target stream's test set (probes fitted on its
training set; evaluation only).

:func:`pretrained_vit_path` is what the suites call: the package's committed asset of the
recipe, or, without one, :func:`training_function` run in-process and cached. The script
``training/pretrain_vit.py`` is the command line over this module (``accelerate launch`` works).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import ViTConfig, ViTForImageClassification

from hf_clroute.backbones.assets import installed_asset_path
from hf_clroute.backbones.catalog import vit_image_processor
from hf_clroute.backbones.pretraining import (
    recipes as pretrained,  # its cache and asset roots are looked up at call time (tests point them elsewhere)
)
from hf_clroute.backbones.pretraining.recipes import (
    REPORT_NAME,
    frozen_probe_report,
    get_recipe,
    is_complete_build,
    load_images,
)

# Image normalisation used in training and written into the image processor, so
# that `ImageCollator.from_processor` / `ViTImageProcessor` reproduce it downstream.
IMAGE_SIZE = 28
MEAN, STD = 0.5, 0.5

# Defaults sized for ~6-8 minutes on 2 CPU cores per backbone. Patch 7 gives a
# 4x4 grid (17 tokens with CLS): 3x fewer tokens than patch 4, so a wider and
# deeper model fits the same budget; digits/clothes at 28x28 lose little.
DEFAULTS: dict[str, Any] = {
    "steps": 600,  # ~0.16 s/step on 2 idle cores (~2 min); the cached backbones and all results use 600
    "batch_size": 128,  # labelled source images per step
    "target_batch_size": 128,  # unlabelled target images per step (x2 views)
    "lr": 1e-3,
    "weight_decay": 0.05,
    "warmup_fraction": 0.05,
    "temperature": 0.2,  # NT-Xent temperature (SimCLR uses 0.1-0.5)
    "contrastive_weight": 1.0,
    "label_smoothing": 0.1,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "patch_size": 7,
    "projection_dim": 64,
    # "linear" or "mlp" (SimCLR's 2-layer head). Measured at 600 steps (vit-mnist-stream, probes
    # fitted on 20k MNIST train images): linear 78.8% NCM / 94.3% probe, mlp 72.6% / 92.0%. The
    # benchmarks read the CLS features themselves (NCM by cosine), so a head that keeps the
    # contrastive geometry close to those features serves them better.
    "projector": "linear",
    # Gaussian blur (p 0.5) and inversion (p 0.2) in the contrastive views too: a backbone that must read
    # images drawn in other styles than its own data (vit-mnist-r-stream) learns to ignore both.
    "invert_blur": False,
    "seed": 0,
    "limit": None,  # keep only the first N images of each split (tests)
    "probe_train_limit": None,
    "probe_test_limit": None,
}


# --------------------------------------------------------------------------- data


class ImageTensorDataset(Dataset):
    """Decoded uint8 images (N, H, W), with or without labels.

    Without labels an item is ``{"pixel_values": ...}`` only: the unlabelled
    target stream cannot leak labels into the training loop by construction.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"pixel_values": self.images[i]}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item


def get_dataloaders(accelerator: Accelerator | None, recipe: str, batch_size: int = 128,
                    target_batch_size: int | None = None, seed: int = 0,
                    limit: int | None = None) -> dict[str, Any]:
    """Loaders for one recipe.

    Returns ``source_train`` (labelled, ``pixel_values`` + ``labels``),
    ``target_unlabeled`` (``pixel_values`` only) -- both yield uint8 images that
    the loop augments in torch -- and the decoded source test set
    (``source_test_images``/``source_test_labels``) and ``source_label_names``.
    Images are decoded once up front: PNG decoding every step would dominate a
    multi-epoch CPU loop.
    """
    spec = get_recipe(recipe)
    src_images, src_labels = load_images(spec.source, "train", limit=limit)
    test_images, test_labels = load_images(spec.source, "test", limit=limit)
    tgt_images, _ = load_images(spec.contrastive_data, "train", with_labels=False, limit=limit)

    from hf_clroute.data.labeled import load_labeled_dataset

    names = load_labeled_dataset(spec.source)["train"].features["label"].names
    gen_src = torch.Generator().manual_seed(seed)
    gen_tgt = torch.Generator().manual_seed(seed + 1)
    target_batch_size = target_batch_size or batch_size
    loaders = {
        "source_train": DataLoader(ImageTensorDataset(src_images, src_labels), batch_size=batch_size,
                                   shuffle=True, drop_last=True, generator=gen_src),
        "target_unlabeled": DataLoader(ImageTensorDataset(tgt_images), batch_size=target_batch_size,
                                       shuffle=True, drop_last=True, generator=gen_tgt),
    }
    if accelerator is not None:
        loaders = dict(zip(loaders, accelerator.prepare(*loaders.values())))
    loaders.update(source_test_images=test_images, source_test_labels=test_labels, source_label_names=names)
    return loaders


def forever(loader: DataLoader):
    """Cycle a loader; each pass reshuffles (the sampler draws a new permutation)."""
    while True:
        yield from loader


# --------------------------------------------------------------------------- augmentation


def augment(images: torch.Tensor, strong: bool, invert_blur: bool = False) -> torch.Tensor:
    """uint8 (B, H, W) -> normalised float (B, 1, H, W) with random augmentations, batched in torch.

    Random affine (scale, rotation, shear, translation) by ``affine_grid``: the
    28x28 analogue of SimCLR's random resized crop. No flips: they change a
    digit's identity. ``strong`` (contrastive views) adds contrast/brightness
    jitter, Gaussian noise and a random erased 8x8 box, so that matching two
    views needs the shape, not pixel statistics; the supervised source batch
    gets the mild affine only.
    """
    b, h, w = images.shape
    x = images.float().div(255.0).unsqueeze(1)
    u = lambda lo, hi, *shape: torch.empty(b, *shape, device=x.device).uniform_(lo, hi)  # noqa: E731
    k = 1.0 if strong else 0.5
    scale = u(1 - 0.25 * k, 1 + 0.15 * k)
    angle = u(-0.3 * k, 0.3 * k)
    shear = u(-0.2 * k, 0.2 * k, 2)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([
        torch.stack([cos + shear[:, 0], -sin, u(-0.2 * k, 0.2 * k)], 1),
        torch.stack([sin, cos + shear[:, 1], u(-0.2 * k, 0.2 * k)], 1),
    ], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, align_corners=False)
    if strong:
        x = x * u(0.6, 1.4, 1, 1, 1) + u(-0.2, 0.2, 1, 1, 1)
        x = x + 0.1 * torch.randn_like(x) * (torch.rand(b, 1, 1, 1, device=x.device) < 0.5)
        top = torch.randint(0, h - 8, (b, 1, 1), device=x.device)
        left = torch.randint(0, w - 8, (b, 1, 1), device=x.device)
        rows = torch.arange(h, device=x.device).view(1, h, 1)
        cols = torch.arange(w, device=x.device).view(1, 1, w)
        box = (rows >= top) & (rows < top + 8) & (cols >= left) & (cols < left + 8)
        box &= (torch.rand(b, 1, 1, device=x.device) < 0.5)
        x = x.masked_fill(box.unsqueeze(1), 0.0).clamp(0.0, 1.0)
        if invert_blur:  # the photometric ops of common self-supervised views: Gaussian blur and inversion
            x = torch.where(torch.rand(b, 1, 1, 1, device=x.device) < 0.5, gaussian_blur(x, u(0.3, 1.5, 1, 1, 1)), x)
            x = torch.where(torch.rand(b, 1, 1, 1, device=x.device) < 0.2, 1.0 - x, x)
    return (x - MEAN) / STD


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) blurred by a 5x5 Gaussian of per-image ``sigma`` (B, 1, 1, 1), separably."""
    offsets = torch.arange(-2, 3, dtype=x.dtype, device=x.device).view(1, 1, 1, 5)
    kernel = torch.exp(-offsets**2 / (2 * sigma**2))
    kernel = (kernel / kernel.sum(-1, keepdim=True)).view(-1, 1, 1, 5)  # one kernel per image
    b = x.shape[0]
    rows = F.conv2d(x.view(1, b, *x.shape[2:]), kernel, padding=(0, 2), groups=b)
    cols = F.conv2d(rows, kernel.transpose(2, 3), padding=(2, 0), groups=b)
    return cols.view_as(x)


# --------------------------------------------------------------------------- model


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's loss: each view must pick its partner among the other 2B-1 views."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z1.shape[0]
    sim = z @ z.T / temperature
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
    return F.cross_entropy(sim, targets)


class Pretrainer(nn.Module):
    """The saved ``ViTForImageClassification`` plus a contrastive projection head (discarded).

    One module with one forward, so DDP under ``accelerate launch`` sees every
    parameter used every step. The contrastive loss acts on the CLS token of
    ``last_hidden_state`` -- the very features the frozen-backbone benchmarks read --
    through a projector (linear by default; see ``DEFAULTS["projector"]``).
    """

    def __init__(self, config: ViTConfig, projection_dim: int, projector: str = "linear") -> None:
        super().__init__()
        self.model = ViTForImageClassification(config)
        d = config.hidden_size
        if projector == "mlp":
            self.projector = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, projection_dim))
        elif projector == "linear":
            self.projector = nn.Linear(d, projection_dim)
        else:
            raise ValueError(f"projector must be 'mlp' or 'linear', got {projector!r}")

    def forward(self, source: torch.Tensor, labels: torch.Tensor, views: torch.Tensor,
                temperature: float, label_smoothing: float) -> dict[str, torch.Tensor]:
        n_src = source.shape[0]
        cls = self.model.vit(pixel_values=torch.cat([source, views])).last_hidden_state[:, 0]
        ce = F.cross_entropy(self.model.classifier(cls[:n_src]), labels, label_smoothing=label_smoothing)
        z = self.projector(cls[n_src:])
        z1, z2 = z.chunk(2)
        return {"ce": ce, "contrastive": nt_xent(z1, z2, temperature)}


def build_config(cfg: dict[str, Any], label_names: list[str]) -> ViTConfig:
    return ViTConfig(
        image_size=IMAGE_SIZE, patch_size=cfg["patch_size"], num_channels=1,
        hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"], intermediate_size=cfg["intermediate_size"],
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,  # augmentation regularises; short run
        num_labels=len(label_names), id2label=dict(enumerate(label_names)),
        label2id={name: i for i, name in enumerate(label_names)},
    )


@torch.no_grad()
def source_accuracy(model: ViTForImageClassification, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(images), 1000):
        x = (images[i:i + 1000].float().div(255.0).unsqueeze(1) - MEAN) / STD
        correct += (model(pixel_values=x).logits.argmax(1) == labels[i:i + 1000]).sum().item()
    return correct / len(labels)


def model_card(report: dict[str, Any]) -> str:
    """A short README.md so the directory is a Hub-ready model repo that says what it is."""
    spec, probe = report["recipe"], report["target_probe"]
    return f"""---
library_name: transformers
pipeline_tag: image-classification
tags: [vit, hf_clroute, continual-learning, stand-in-backbone]
---

# {spec["name"]}

A small ViT (28x28 grayscale, {report["num_parameters"]:,} parameters) pretrained offline by
`training/pretrain_vit.py` of hf_clroute as a stand-in for a web-pretrained backbone for the
{spec["stream"]} stream. {spec["description"]}

Objective: {report["objective"]}.

| | |
|---|---|
| steps | {report["steps"]} |
| training wall time | {report["train_seconds"]} s on {report["torch_threads"]} CPU threads |
| {spec["source"]} test accuracy (classifier head) | {report["source_test_accuracy"]:.4f} |
| {spec["target"]} frozen CLS features: nearest-class-mean (cosine) | {probe["ncm_accuracy"]:.4f} |
| {spec["target"]} frozen CLS features: linear probe (logistic regression) | {probe["linear_probe_accuracy"]:.4f} |

The probes are fitted on {probe["n_train"]} {spec["target"]} training images and scored on {probe["n_test"]}
test images; their labels never reach the backbone. Full details: `pretrain_report.json`.
"""


# --------------------------------------------------------------------------- training


def training_function(recipe: str, out: str, **overrides: Any) -> dict[str, Any]:
    """Pretrain recipe ``recipe`` and save the checkpoint + report into ``out``.

    ``overrides``: any key of :data:`DEFAULTS`. Returns the report dict (main
    process; other processes return it without the probe numbers).
    """
    spec = get_recipe(recipe)
    unknown = (set(overrides) | set(spec.settings)) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"training_function: unknown settings {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **spec.settings, **{k: v for k, v in overrides.items() if v is not None}}
    accelerator = Accelerator()
    set_seed(cfg["seed"])
    start = time.time()

    data = get_dataloaders(accelerator, recipe, cfg["batch_size"], cfg["target_batch_size"],
                           cfg["seed"], cfg["limit"])
    data_seconds = time.time() - start
    names = data["source_label_names"]
    net = Pretrainer(build_config(cfg, names), cfg["projection_dim"], cfg["projector"])
    n_params = sum(p.numel() for p in net.model.parameters())
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps = cfg["steps"]
    warmup = max(1, int(cfg["warmup_fraction"] * steps))
    # linear warmup then cosine decay to 0: the usual ViT schedule; a short run needs the decay to settle.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    net, optimizer, scheduler = accelerator.prepare(net, optimizer, scheduler)

    source_iter, target_iter = forever(data["source_train"]), forever(data["target_unlabeled"])
    net.train()
    history = []
    log_every = max(1, steps // 20)
    for step in range(steps):
        src = next(source_iter)
        tgt = next(target_iter)
        assert "labels" not in tgt  # the target stream's labels never enter training
        views = torch.cat([augment(tgt["pixel_values"], strong=True, invert_blur=cfg["invert_blur"])
                           for _ in range(2)])
        losses = net(augment(src["pixel_values"], strong=False), src["labels"], views,
                     cfg["temperature"], cfg["label_smoothing"])
        loss = losses["ce"] + cfg["contrastive_weight"] * losses["contrastive"]
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step % log_every == 0 or step == steps - 1:
            row = {"step": step, **{k: round(v.item(), 4) for k, v in losses.items()},
                   "seconds": round(time.time() - start, 1)}
            history.append(row)
            accelerator.print(json.dumps(row))
    train_seconds = time.time() - start

    report: dict[str, Any] = {
        "recipe": spec.to_dict(),
        "objective": (
            f"cross-entropy on labelled {spec.source} (mild affine augmentation, label smoothing "
            f"{cfg['label_smoothing']}) + {cfg['contrastive_weight']} x SimCLR NT-Xent (temperature "
            f"{cfg['temperature']}) on two strongly augmented views of UNLABELLED {spec.contrastive_data} "
            "training images "
            f"(affine, contrast/brightness, noise, erasing{', blur, inversion' if cfg['invert_blur'] else ''}); "
            "one shared backbone pass; "
            "the target's labels are never read"
        ),
        "target_labels_used": False,
        "steps": steps,
        "settings": cfg,
        "num_parameters": n_params,
        "num_processes": accelerator.num_processes,
        "torch_threads": torch.get_num_threads(),
        "data_seconds": round(data_seconds, 1),  # loading + decoding the images once
        "train_seconds": round(train_seconds, 1),  # data_seconds + the optimisation loop
        "loss_history": history,
    }
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(net).model
        model.save_pretrained(out)
        processor = vit_image_processor(  # saved as a ViTImageProcessor config, made without the warning
            do_resize=True, size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            do_rescale=True, do_normalize=True, image_mean=[MEAN], image_std=[STD],
        )
        processor.save_pretrained(out)
        report["source_test_accuracy"] = source_accuracy(model, data["source_test_images"],
                                                         data["source_test_labels"])
        # Probes read the checkpoint back from disk: what is measured is what was saved.
        report["target_probe"] = frozen_probe_report(out, spec.target, train_limit=cfg["probe_train_limit"],
                                                     test_limit=cfg["probe_test_limit"])
        report["total_seconds"] = round(time.time() - start, 1)
        Path(out, REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        Path(out, "README.md").write_text(model_card(report))
        accelerator.print(json.dumps({k: report[k] for k in ("train_seconds", "source_test_accuracy")}
                                     | {k: report["target_probe"][k] for k in
                                        ("ncm_accuracy", "linear_probe_accuracy")}))
    accelerator.wait_for_everyone()
    return report


def pretrained_vit_path(recipe: str, build: bool = True, use_asset: bool = True, **train_overrides: Any) -> str:
    """Directory of the cached stand-in backbone ``recipe`` (``cache_dir()/models/<recipe>``).

    With the package's committed asset (:func:`asset_dir`) the cached copy is that asset: installed
    when missing, re-checked against its ``SHA256SUMS`` (once per process per file) and replaced
    from the asset, with a warning, when it differs (an older build left in the cache); a damaged
    asset is an error naming the file (:mod:`hf_clroute.backbones.assets`). This takes a second
    instead of 20 CPU minutes. The asset was built with the default recipe, so it is skipped when
    ``train_overrides`` (e.g. ``steps=20``, for tests, which should also point ``HF_CLROUTE_CACHE``
    elsewhere) are given or ``use_asset`` is false; then a complete cached build is used as it is,
    or, if ``build`` is true,     :func:`training_function` runs in this
    process, writing into a temporary sibling directory renamed into place only when complete.
    """
    get_recipe(recipe)
    final = pretrained.models_dir() / recipe
    asset = pretrained.asset_dir(recipe) if use_asset and not train_overrides else None
    if asset is not None:
        return str(installed_asset_path(asset, final))
    if is_complete_build(final):
        return str(final)
    if not build:
        raise FileNotFoundError(
            f"pretrained ViT {recipe!r} is not built at {final}; call pretrained_vit_path({recipe!r}) "
            f"or run `python training/pretrain_vit.py --recipe {recipe} --out {final}`"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{recipe}.building-", dir=final.parent))
    try:
        training_function(recipe, str(tmp), **train_overrides)
        if final.exists() and not is_complete_build(final):
            shutil.rmtree(final)  # debris of an interrupted `--out` run, never a finished checkpoint
        try:
            os.replace(tmp, final)  # atomic on one filesystem; fails if another build won the race
        except OSError:
            if not is_complete_build(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final)
