"""Stand-in pretrained ViT backbones, built offline.

No pretrained ViT can be downloaded on these machines, so a small
``ViTForImageClassification`` (28x28 grayscale, patch 7, hidden 128, 4 layers, ~0.54M parameters) is
pretrained in-project by :mod:`hf_clroute.backbones.pretraining.vit` and cached as a normal
transformers checkpoint (``config.json`` + ``model.safetensors`` +
``preprocessor_config.json``) that ``from_pretrained`` loads and that can be
pushed to the Hub like any other model.

Each recipe pretrains for ONE benchmark stream and never sees that stream's
labels: it learns from the labels of a *different* dataset (supervised
cross-entropy) plus the *unlabelled* training images of the stream's dataset
(self-supervised contrastive loss), the way web-scale pretraining has seen
images like the benchmarks' but not their annotations.

Public API
----------
* :data:`RECIPES` -- recipe name -> :class:`Recipe` (description, the data used).
* :func:`hf_clroute.backbones.pretraining.vit.pretrained_vit_path` (with the training code) -- the cached
  checkpoint directory: installed from the package's committed asset
  (``hf_clroute/backbones/pretraining/assets/<recipe>``, sha256-checked) when there is one, else built on first use.
* :func:`write_asset` -- turn a built checkpoint into such an asset (``training/pretrain_vit.py --asset``).
* :func:`frozen_probe_report` -- nearest-class-mean and linear-probe accuracy of a
  checkpoint's frozen features (the CLS token of ``ViTModel.last_hidden_state``)
  on a dataset, to say how good a backbone is for a stream.
* :func:`load_images` -- a dataset split decoded once into a uint8 tensor.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hf_clroute.backbones.assets import ASSET_FILES, CHECKSUMS_NAME, COMPRESSED
from hf_clroute.hub.io import sha256_file as _sha256
from hf_clroute.metrics.probes import (
    linear_probe_accuracy,  # the probe lives with the probes; importable here too
)

__all__ = [
    "RECIPES",
    "Recipe",
    "write_asset",
    "asset_dir",
    "frozen_probe_report",
    "load_images",
    "extract_features",
    "ncm_accuracy",
    "linear_probe_accuracy",
]

REPORT_NAME = "pretrain_report.json"


@dataclass(frozen=True)
class Recipe:
    """What a stand-in backbone learns from, and for which stream it is meant.

    ``source``: a dataset whose labels train the classifier head (cross-entropy).
    ``target``: the dataset of the benchmark stream; ONLY its unlabelled training
    images are used (self-supervised loss); its labels never reach the backbone.
    ``unlabelled``: the dataset whose unlabelled training images feed the
    self-supervised loss instead of the target's (a backbone that must never see
    the stream's images, e.g. ``source`` itself); the probes still read ``target``.
    ``settings``: the recipe's own values of ``hf_clroute.backbones.pretraining.vit.DEFAULTS``
    (its architecture, steps), under any command-line override.
    """

    name: str
    description: str
    source: str
    target: str
    stream: str
    unlabelled: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def contrastive_data(self) -> str:
        """The dataset whose unlabelled training images the self-supervised loss reads."""
        return self.unlabelled or self.target

    def to_dict(self) -> dict[str, Any]:
        # Optional fields left at their defaults are omitted: the committed assets' reports predate them.
        return {k: v for k, v in asdict(self).items() if v or k not in ("unlabelled", "settings")}


RECIPES: dict[str, Recipe] = {
    "vit-mnist-stream": Recipe(
        name="vit-mnist-stream",
        description=(
            "Backbone for the Split-MNIST stream: supervised on Fashion-MNIST labels + "
            "SimCLR (NT-Xent) on unlabelled MNIST training images; never sees MNIST labels."
        ),
        source="fashion_mnist",
        target="mnist",
        stream="Split-MNIST",
    ),
    "vit-fashion-stream": Recipe(
        name="vit-fashion-stream",
        description=(
            "Backbone for the Split-Fashion stream: supervised on MNIST labels + "
            "SimCLR (NT-Xent) on unlabelled Fashion-MNIST training images; never sees Fashion-MNIST labels."
        ),
        source="mnist",
        target="fashion_mnist",
        stream="Split-Fashion",
    ),
    # Room to adapt and to route: the stream's images, MNIST renditions, are never seen, not even
    # unlabelled; the backbone knows clothing only. Its report records the steps, the loss history, the
    # source's test accuracy and the frozen probes on the stream.
    "vit-mnist-r-stream": Recipe(
        name="vit-mnist-r-stream",
        description=(
            "Backbone for the Split-MNIST-R stream (MNIST renditions): supervised on Fashion-MNIST labels + "
            "SimCLR (NT-Xent) on the same unlabelled Fashion-MNIST training images; it never sees an MNIST "
            "image, plain or rendered, nor a digit of any source."
        ),
        source="fashion_mnist",
        target="mnist_r",
        stream="Split-MNIST-R",
        unlabelled="fashion_mnist",
        # 4 blocks of width 128 over 49 patches, trained to convergence (about 5 epochs of Fashion-MNIST, loss
        # flat at the end): a 6x192 model would need several CPU-hours to get there here, and an undertrained
        # backbone leaves every online method near chance.
        settings={"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 256,
                  "patch_size": 4, "steps": 2400, "batch_size": 128, "target_batch_size": 32, "invert_blur": True,
                  "probe_train_limit": 10000},
    ),
}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown pretrained-ViT recipe {name!r}; known: {', '.join(RECIPES)}") from None


# --------------------------------------------------------------------------- cache


def models_dir() -> Path:
    from hf_clroute.data.sources import cache_dir

    return cache_dir() / "models"


def is_complete_build(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "preprocessor_config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "pytorch_model.bin").is_file()
    )


# --------------------------------------------------------------------------- committed assets


def assets_root() -> Path:
    """``hf_clroute/backbones/pretraining/assets``: shipped as package data, so an installed wheel has it."""
    return Path(__file__).resolve().parent / "assets"


def asset_dir(recipe: str) -> Path | None:
    """The committed asset of ``recipe`` (a directory with ``SHA256SUMS``), or None when absent."""
    path = assets_root() / get_recipe(recipe).name
    return path if (path / CHECKSUMS_NAME).is_file() else None


def write_asset(checkpoint: str | os.PathLike, recipe: str, root: str | os.PathLike | None = None) -> Path:
    """Store the built checkpoint ``checkpoint`` as the committed asset of ``recipe``.

    Writes ``<root>/<recipe>/`` (``root`` defaults to :func:`assets_root`): the
    small files as they are, the weights xz-compressed, and ``SHA256SUMS`` of the
    files as installed. Replaces an existing asset of that recipe atomically.
    """
    get_recipe(recipe)
    checkpoint = Path(checkpoint)
    missing = [name for name in ASSET_FILES if not (checkpoint / name).is_file()]
    if missing:
        raise FileNotFoundError(f"write_asset: {checkpoint} is not a built checkpoint (missing {', '.join(missing)})")
    target = Path(root) / recipe if root is not None else assets_root() / recipe
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{recipe}.writing-", dir=target.parent))
    try:
        for name in ASSET_FILES:
            if name in COMPRESSED:
                with open(checkpoint / name, "rb") as src, lzma.open(tmp / COMPRESSED[name], "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(checkpoint / name, tmp / name)
        sums = "".join(f"{_sha256(checkpoint / name)}  {name}\n" for name in ASSET_FILES)
        (tmp / CHECKSUMS_NAME).write_text(sums)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a package directory is readable by all
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- data


def load_images(dataset_name: str, split: str, with_labels: bool = True,
                limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split ``split`` of ``dataset_name`` decoded once into (N, H, W) uint8 [+ (N,) int64 labels].

    A multi-epoch CPU loop should not decode PNGs every step: 60k 28x28 images
    are 47 MB as uint8. With ``with_labels=False`` the label column is dropped
    *before* anything is read, so the labels provably never leave the dataset.
    ``limit`` keeps the first ``limit`` examples (tests).
    """
    from hf_clroute.data.labeled import load_labeled_dataset
    from hf_clroute.data.sources import SOURCES, load_source

    if with_labels:
        ds = load_labeled_dataset(dataset_name)[split]  # validated: canonical image/label columns
    elif dataset_name in SOURCES:
        ds = load_source(dataset_name)[split].select_columns(["image"])
    else:
        raise ValueError(f"load_images: unlabelled loading supports the offline sources "
                         f"({', '.join(SOURCES)}), not {dataset_name!r}")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    labels = torch.tensor(ds["label"], dtype=torch.long) if with_labels else None
    arrays = [np.asarray(im.convert("L")) for im in ds.select_columns(["image"])["image"]]
    return torch.from_numpy(np.stack(arrays)), labels


# --------------------------------------------------------------------------- probes


def _load_vit(model_path: str | os.PathLike) -> tuple[Any, Any]:
    from transformers import AutoImageProcessor, ViTModel
    from transformers.utils import logging as hf_logging

    # A ViTForImageClassification checkpoint loads into ViTModel with its classifier
    # reported as unexpected; that is intended here (features only), so keep it quiet.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = ViTModel.from_pretrained(str(model_path), add_pooling_layer=False)
    finally:
        hf_logging.set_verbosity(verbosity)
    processor = AutoImageProcessor.from_pretrained(str(model_path))
    return model.eval(), processor


@torch.no_grad()
def extract_features(model: Any, images: torch.Tensor, mean: float, std: float,
                     batch_size: int = 1000) -> torch.Tensor:
    """Frozen features: the CLS token of ``last_hidden_state`` (after ViTModel's final
    LayerNorm) -- exactly what the benchmark's frozen-backbone methods use."""
    base = getattr(model, "vit", model)  # ViTForImageClassification -> its ViTModel
    was_training = base.training
    base.eval()
    out = []
    for i in range(0, len(images), batch_size):
        x = images[i:i + batch_size].float().div(255.0).unsqueeze(1)
        x = (x - mean) / std
        out.append(base(pixel_values=x).last_hidden_state[:, 0].float())
    base.train(was_training)
    return torch.cat(out)


def ncm_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor,
                 test_y: torch.Tensor) -> float:
    """Nearest class mean by cosine: class means of L2-normalised features,
    prediction = the most cosine-similar mean."""
    classes = torch.unique(train_y)
    normed = F.normalize(train_x, dim=1)
    means = F.normalize(torch.stack([normed[train_y == c].mean(0) for c in classes]), dim=1)
    pred = classes[(F.normalize(test_x, dim=1) @ means.T).argmax(1)]
    return (pred == test_y).float().mean().item()



def frozen_probe_report(model_path: str | os.PathLike | Any, dataset_name: str,
                        train_limit: int | None = None, test_limit: int | None = None,
                        mean: float | None = None, std: float | None = None) -> dict[str, Any]:
    """How good a frozen backbone is on ``dataset_name``: NCM and linear-probe accuracy.

    ``model_path``: a checkpoint directory / Hub id (its image processor gives the
    normalisation), or an already-loaded ViT model (then pass ``mean``/``std``).
    Probes are fitted on the dataset's training split (first ``train_limit``
    examples) and scored on its test split. They are evaluation only: nothing
    here updates the backbone.
    """
    start = time.time()
    if isinstance(model_path, (str, os.PathLike)):
        model, processor = _load_vit(model_path)
        mean = float(np.mean(processor.image_mean)) if mean is None else mean
        std = float(np.mean(processor.image_std)) if std is None else std
    else:
        model = model_path
        if mean is None or std is None:
            raise ValueError("frozen_probe_report: pass mean and std with a loaded model")
    train_images, train_y = load_images(dataset_name, "train", limit=train_limit)
    test_images, test_y = load_images(dataset_name, "test", limit=test_limit)
    train_x = extract_features(model, train_images, mean, std)
    test_x = extract_features(model, test_images, mean, std)
    return {
        "dataset": dataset_name,
        "features": "CLS token of ViTModel last_hidden_state (after the final LayerNorm), frozen",
        "n_train": len(train_y),
        "n_test": len(test_y),
        "feature_dim": int(train_x.shape[1]),
        "ncm_accuracy": ncm_accuracy(train_x, train_y, test_x, test_y),
        "ncm": "cosine similarity to the mean of L2-normalised training features per class",
        "linear_probe_accuracy": linear_probe_accuracy(train_x, train_y, test_x, test_y),
        "linear_probe": "multinomial logistic regression on standardised features, L-BFGS to convergence, L2 1e-4",
        "seconds": round(time.time() - start, 1),
    }


def read_report(model_path: str | os.PathLike) -> dict[str, Any]:
    """The ``pretrain_report.json`` written next to a built checkpoint."""
    return json.loads((Path(model_path) / REPORT_NAME).read_text())
