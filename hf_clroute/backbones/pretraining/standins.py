"""Offline stand-ins with the real shapes for the paper-setting suites.

The paper suites (``split-cifar100``, ``split-imagenet-r``, ``split-banking77``) name Hub
datasets and Hub backbones, which cannot be downloaded here. A stand-in keeps what the code
path sees -- column names and split layout, 3-channel images, a 224x224 patch-16 ViT with
197 tokens, a BERT with the ``bert-base-uncased`` vocabulary and tokenizer -- and shrinks the
rest (few examples, a tiny hidden size, random weights), so the very same suite definition
runs end to end on a CPU:

* datasets: real images (Fashion-MNIST) or real sentences (WordNet definitions) written as
  local parquet files under the Hub dataset's column names;
* backbones: a randomly initialised model of the real checkpoint's configuration shape,
  saved with ``save_pretrained`` together with its image processor or tokenizer.

A suite refers to them as ``standin:<name>`` (dataset or backbone); they are built into
``cache_dir()/standins/<name>`` on first use. ``python -m hf_clroute.backbones.pretraining.standins`` builds
them all and prints where. Random weights mean accuracies here say nothing about the
methods: stand-ins prove the code path, not the numbers.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = [
    "STANDIN_BACKBONES", "STANDIN_DATASETS", "build_all", "standin_path", "vit_b16_config", "bert_base_config",
]

PREFIX = "standin:"
_DONE = ".complete"  # written last: a directory without it is a build that did not finish


@dataclass(frozen=True)
class StandIn:
    """One buildable stand-in: what it imitates and the function that writes it into a directory."""

    imitates: str
    build: Callable[[Path], None]


# --------------------------------------------------------------------------- backbones
def vit_b16_config(small: bool = True, **overrides: Any) -> Any:
    """The configuration of ``google/vit-base-patch16-224-in21k``: 224x224 RGB, patch 16, so
    196 patches + [CLS] = 197 tokens. ``small`` keeps that token shape with hidden 32, 4 layers
    (RwF routes the first 3 blocks; a 4th keeps one unrouted) and 2 heads, for CPU tests;
    ``small=False`` is the real ViT-B/16 (hidden 768, 12 layers, 12 heads, MLP 3072)."""
    from transformers import ViTConfig

    shape = dict(image_size=224, patch_size=16, num_channels=3, qkv_bias=True, layer_norm_eps=1e-12)
    size = (dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64) if small
            else dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072))
    return ViTConfig(**{**shape, **size, **overrides})


def vit_b16_processor() -> Any:
    """The in21k checkpoint's preprocessing: resize to 224x224, normalise with mean = std = 0.5."""
    from hf_clroute.backbones.catalog import vit_image_processor

    return vit_image_processor(size={"height": 224, "width": 224}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def bert_base_config(small: bool = True, **overrides: Any) -> Any:
    """The configuration of ``bert-base-uncased`` (vocabulary 30522, 512 positions, 2 token types);
    ``small`` shrinks it to hidden 32, 4 layers, 2 heads."""
    from transformers import BertConfig

    shape = dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)
    size = (dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64) if small
            else dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072))
    return BertConfig(**{**shape, **size, **overrides})


def _build_vit(out: Path) -> None:
    import torch
    from transformers import ViTModel

    torch.manual_seed(0)
    ViTModel(vit_b16_config(small=True)).save_pretrained(out)
    vit_b16_processor().save_pretrained(out)


def _build_bert(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertModel

    from hf_clroute.backbones.catalog import offline_model_path

    # MiniLM ships the bert-base-uncased WordPiece vocabulary (30522 tokens, lower-cased),
    # so its tokenizer produces exactly the ids bert-base-uncased would.
    tokenizer = AutoTokenizer.from_pretrained(offline_model_path("minilm"))
    config = bert_base_config(small=True)
    if len(tokenizer) != config.vocab_size:
        raise ValueError(f"stand-in bert-base-small: the offline tokenizer has {len(tokenizer)} tokens, "
                         f"bert-base-uncased has {config.vocab_size}")
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------- datasets
def _class_rows(labels: np.ndarray, classes: list[int], per_class: int, rng: np.random.Generator) -> np.ndarray:
    rows = []
    for c in classes:
        where = np.flatnonzero(labels == c)
        if len(where) < per_class:
            raise ValueError(f"stand-in dataset: class {c} has {len(where)} examples, {per_class} are needed")
        rows.append(np.sort(rng.choice(where, per_class, replace=False)))
    return np.concatenate(rows)


def _rgb_png(gray: Any, size: int, tint: np.ndarray) -> dict[str, Any]:
    """A gray image as a colour PNG of ``size`` x ``size``: each channel scaled by ``tint``, so the
    three channels differ (a replicated gray image would hide channel-order mistakes)."""
    from PIL import Image as PILImage

    array = np.asarray(gray.convert("L").resize((size, size), resample=2), dtype=np.float32)
    rgb = np.clip(array[..., None] * tint[None, None, :], 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(rgb, mode="RGB").save(buf, format="PNG", compress_level=1)
    return {"bytes": buf.getvalue(), "path": None}


def _image_split(source: Any, rows: np.ndarray, size: int, image_column: str, label_column: str,
                 names: list[str], classes: list[int], seed: int) -> Any:
    from datasets import ClassLabel, Dataset, Features, Image

    rng = np.random.default_rng(seed)
    picked = source.select(rows.tolist())
    images = [_rgb_png(im, size, rng.uniform(0.5, 1.0, 3)) for im in picked["image"]]
    remap = {c: i for i, c in enumerate(classes)}
    labels = [remap[int(y)] for y in picked["label"]]
    features = Features({image_column: Image(), label_column: ClassLabel(names=names)})
    return Dataset.from_dict({image_column: images, label_column: labels}, features=features)


def _fashion(per_class: dict[str, int], size: int, image_column: str, label_column: str) -> dict[str, Any]:
    """Fashion-MNIST as colour PNGs: ``per_class`` examples of each of its 10 classes per split."""
    from hf_clroute.data.labeled import column_array
    from hf_clroute.data.sources import load_source

    source = load_source("fashion_mnist")
    names = source["train"].features["label"].names
    classes = list(range(len(names)))
    out = {}
    for i, (split, count) in enumerate(per_class.items()):
        origin = source["test" if split == "test" else "train"]
        rows = _class_rows(column_array(origin), classes, count, np.random.default_rng(i))
        out[split] = _image_split(origin, rows, size, image_column, label_column, names, classes, seed=i)
    return out


def _build_cifar100_shape(out: Path) -> None:
    # uoft-cs/cifar100: splits train/test, 32x32 RGB PNGs in `img`, class in `fine_label`.
    for split, ds in _fashion({"train": 40, "test": 10}, 32, "img", "fine_label").items():
        _write(ds, out / f"{split}.parquet")


def _build_imagenet_r_shape(out: Path) -> None:
    # axiong/imagenet-r: one split named "test" (the suite carves its own test set from it), an
    # `image` column of larger colour images. Its labels are wnid strings; this stand-in's are
    # integers in `label` (see the stand-in suite file).
    splits = _fashion({"all": 50}, 64, "image", "label")
    _write(splits["all"], out / "test.parquet")


def _build_banking77_shape(out: Path) -> None:
    """Banking77's columns (`text`, `label`, splits train/test) filled with WordNet definitions
    of the 10 largest lexicographer categories."""
    from datasets import ClassLabel, Dataset, Features, Value

    from hf_clroute.data.labeled import column_array
    from hf_clroute.data.sources import load_source

    source = load_source("wordnet")
    counts = np.bincount(column_array(source["train"]))
    classes = sorted(np.argsort(-counts)[:10].tolist())
    names = [source["train"].features["label"].names[c] for c in classes]
    remap = {c: i for i, c in enumerate(classes)}
    features = Features({"text": Value("string"), "label": ClassLabel(names=names)})
    for i, (split, count) in enumerate((("train", 40), ("test", 10))):
        origin = source[split]
        rows = _class_rows(column_array(origin), classes, count, np.random.default_rng(i))
        picked = origin.select(rows.tolist())
        ds = Dataset.from_dict({"text": list(picked["text"]), "label": [remap[int(y)] for y in picked["label"]]},
                               features=features)
        _write(ds, out / f"{split}.parquet")


def _write(ds: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    # The table's schema metadata carries the datasets features (Image, ClassLabel).
    pq.write_table(ds.with_format(None).data.table, path)


STANDIN_DATASETS: dict[str, StandIn] = {
    "cifar100-shape": StandIn("uoft-cs/cifar100 (img, fine_label; train/test; 32x32 RGB PNG): "
                              "Fashion-MNIST, 10 classes, 40 + 10 per class", _build_cifar100_shape),
    "imagenet-r-shape": StandIn("axiong/imagenet-r (image; one split 'test'; larger RGB images): "
                                "Fashion-MNIST at 64x64, 10 classes, 50 per class", _build_imagenet_r_shape),
    "banking77-shape": StandIn("legacy-datasets/banking77 (text, label; train/test): WordNet definitions "
                               "of 10 categories, 40 + 10 per class", _build_banking77_shape),
}
STANDIN_BACKBONES: dict[str, StandIn] = {
    "vit-b16-small": StandIn("google/vit-base-patch16-224-in21k's shape (224, patch 16, 197 tokens) at "
                             "hidden 32, 4 layers, random weights", _build_vit),
    "bert-base-small": StandIn("bert-base-uncased's vocabulary and tokenizer at hidden 32, 4 layers, "
                               "random weights", _build_bert),
}


# --------------------------------------------------------------------------- cache
def standin_dir() -> Path:
    from hf_clroute.data.sources import cache_dir

    return cache_dir() / "standins"


def standin_path(ref: str, build: bool = True) -> str:
    """Directory of stand-in ``ref`` (``"standin:<name>"`` or ``"<name>"``), built on first use."""
    name = ref[len(PREFIX):] if ref.startswith(PREFIX) else ref
    known = {**STANDIN_DATASETS, **STANDIN_BACKBONES}
    if name not in known:
        raise ValueError(f"unknown stand-in {name!r}; known: {sorted(known)}")
    path = standin_dir() / name
    if not (path / _DONE).is_file():
        if not build:
            raise FileNotFoundError(
                f"stand-in {name!r} is not built; run `python -m hf_clroute.backbones.pretraining.standins`")
        _build_into(path, known[name])
    return str(path)


def _build_into(path: Path, standin: StandIn) -> None:
    """Build in a temporary sibling directory and rename it into place, so a concurrent reader
    (another process of the same launch) never sees a half-written stand-in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        standin.build(tmp)
        (tmp / _DONE).write_text(standin.imitates + "\n")
        try:
            os.replace(tmp, path)
        except OSError:  # another process finished first: keep its copy
            if not (path / _DONE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_all() -> dict[str, str]:
    return {name: standin_path(name) for name in [*STANDIN_DATASETS, *STANDIN_BACKBONES]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the offline stand-ins of the paper-setting suites.")
    parser.parse_args(argv)
    standins = {**STANDIN_DATASETS, **STANDIN_BACKBONES}
    for name, path in build_all().items():
        print(f"{PREFIX}{name:18s} {path}\n    imitates {standins[name].imitates}")


if __name__ == "__main__":
    main()
