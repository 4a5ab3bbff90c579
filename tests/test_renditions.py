"""The rendition sources (issue 33): MNIST / Fashion-MNIST redrawn in other styles, one seeded
style per example, and the backbone of Split-MNIST-R, which never sees an MNIST image."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hf_clroute.backbones.pretraining import recipes as pretrained
from hf_clroute.backbones.pretraining import vit as pretrain_vit
from hf_clroute.backbones.pretraining.recipes import RECIPES, load_images
from hf_clroute.backbones.pretraining.vit import pretrained_vit_path
from hf_clroute.bench.harness.suites import SuiteConfig, build_stream
from hf_clroute.data import load_source
from hf_clroute.data.renditions import STYLES, example_rng, render, render_images

RECIPE = "vit-mnist-r-stream"


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    """The first 300 MNIST test digits, uint8 (N, 28, 28)."""
    return load_images("mnist", "test", with_labels=False, limit=300)[0].numpy()


def test_a_rendition_depends_on_its_example_alone(digits: np.ndarray):
    first, again = render_images(digits[:50], "mnist", "test"), render_images(digits[:50], "mnist", "test")
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    # Example i's rendition is the same rendered alone, in another batch, or after others.
    image, style = render(digits[7], example_rng("mnist", "test", 7))
    assert np.array_equal(image, first[0][7]) and style == first[1][7]
    # The seed names the base source, the split and the index: changing any one redraws it.
    for key in (("mnist", "train", 7), ("fashion_mnist", "test", 7), ("mnist", "test", 8)):
        assert not np.array_equal(render(digits[7], example_rng(*key))[0], image), key


def test_every_style_occurs_and_changes_the_image(digits: np.ndarray):
    images, styles = render_images(digits, "mnist", "test")
    assert images.dtype == np.uint8 and images.shape == digits.shape
    counts = np.bincount(styles, minlength=len(STYLES))
    assert counts.min() >= 300 / len(STYLES) / 2, dict(zip(STYLES, counts))  # drawn uniformly
    change = np.abs(images.astype(float) - digits).mean(axis=(1, 2))
    for s, name in enumerate(STYLES):
        assert np.median(change[styles == s]) > 8, name  # no style leaves the digit as it was
    # Inverted digits sit on a light background; an edge map's background stays black.
    corners = images[:, :3, :3].mean(axis=(1, 2))
    assert corners[styles == STYLES.index("inverted")].min() > 140
    assert corners[styles == STYLES.index("edges")].max() < 60


def test_the_source_is_the_base_source_rendered(digits: np.ndarray):
    mnist_r, mnist = load_source("mnist_r"), load_source("mnist")
    assert {s: len(d) for s, d in mnist_r.items()} == {"train": 60_000, "test": 10_000}
    assert mnist_r["train"].features["label"].names == mnist["train"].features["label"].names
    assert mnist_r["train"].features["style"].names == list(STYLES)
    for split in ("train", "test"):
        rows = [0, 123, len(mnist[split]) - 1]
        base = np.stack([np.asarray(mnist[split][i]["image"]) for i in rows])
        for i, b in zip(rows, base):
            expected, style = render(b, example_rng("mnist", split, i))
            row = mnist_r[split][i]
            assert np.array_equal(np.asarray(row["image"]), expected), (split, i)
            assert row["style"] == style and row["label"] == mnist[split][i]["label"]


def _digests(data) -> set[str]:
    return {hashlib.sha1(np.asarray(im).tobytes()).hexdigest() for im in data["image"]}


def test_the_suites_stream_is_class_incremental_with_disjoint_splits():
    suite = SuiteConfig.load("split-mnist-r", quick=True)
    assert suite.dataset == "mnist_r" and suite.backbone == f"pretrained-vit:{RECIPE}"
    stream = build_stream(suite, seed=0)
    assert len(stream) == 5 and [len(e.classes) for e in stream] == [2] * 5
    assert sorted(c for e in stream for c in e.classes) == list(range(10))
    splits = {name: set() for name in ("train", "validation", "test")}
    for experience in stream:
        for name, data in experience.splits().items():
            splits[name] |= _digests(data)
    assert all(splits.values())
    assert not (splits["train"] & splits["validation"]) and not (splits["train"] & splits["test"])
    assert not (splits["validation"] & splits["test"])
    # Quick sizes: 200 train, 20 validation, 100 test examples per class (a duplicate would shrink a set).
    assert [len(splits[k]) for k in ("train", "validation", "test")] == [2000, 200, 1000]


def test_the_backbone_never_sees_an_mnist_image():
    recipe = RECIPES[RECIPE]
    assert recipe.target == "mnist_r" and {recipe.source, recipe.contrastive_data} == {"fashion_mnist"}
    train = pretrain_vit
    data = train.get_dataloaders(None, RECIPE, batch_size=8, limit=64)
    assert data["source_label_names"][0] == "T-shirt/top"
    # The self-supervised loss reads Fashion-MNIST's training images, not the stream's.
    seen = {bytes(im.numpy()) for batch in data["target_unlabeled"] for im in batch["pixel_values"]}
    fashion = load_images("fashion_mnist", "train", with_labels=False, limit=64)[0]
    assert seen == {bytes(im.numpy()) for im in fashion}


def test_recipe_settings_sit_between_the_defaults_and_the_overrides(tmp_path: Path):
    train = pretrain_vit
    report = train.training_function(RECIPE, str(tmp_path), steps=2, limit=32, batch_size=8, target_batch_size=8,
                                     hidden_size=24, num_attention_heads=2, intermediate_size=32,
                                     probe_train_limit=32, probe_test_limit=16)
    settings = report["settings"]
    assert settings["patch_size"] == 4 and settings["num_hidden_layers"] == 4  # the recipe's
    assert settings["hidden_size"] == 24 and settings["steps"] == 2  # the caller's
    assert settings["lr"] == train.DEFAULTS["lr"]  # the script's
    assert report["target_probe"]["dataset"] == "mnist_r"
    assert "UNLABELLED fashion_mnist" in report["objective"]


def test_committed_asset_has_room_to_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The shipped backbone: 4 blocks of width 128 over 49 patches, built by the recipe as it stands, trained
    until its loss is flat, and its frozen features read the stream well enough to leave a head room to learn."""
    from transformers import ViTForImageClassification

    monkeypatch.setattr(pretrained, "models_dir", lambda: tmp_path / "models")
    path = pretrained_vit_path(RECIPE, build=False)  # the committed asset, every sha256 checked
    config = json.loads((Path(path) / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (4, 128)
    assert (config["image_size"] // config["patch_size"]) ** 2 == 49
    report = pretrained.read_report(path)
    assert report["settings"] == {**pretrain_vit.DEFAULTS, **RECIPES[RECIPE].settings}
    assert report["recipe"] == RECIPES[RECIPE].to_dict() and report["target_labels_used"] is False
    model = ViTForImageClassification.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == report["num_parameters"]
    # Trained until the supervised loss is flat: its last five logged points (the last quarter of the run)
    # average within 0.05 of the five before them, and the source's own test accuracy is recorded.
    ce = [row["ce"] for row in report["loss_history"]]
    assert abs(sum(ce[-5:]) / 5 - sum(ce[-10:-5]) / 5) < 0.05
    assert 0.7 < report["source_test_accuracy"] <= 1.0
    # Its frozen features leave a linear head something to read on the stream (the 240-step build: 38%).
    assert report["target_probe"]["linear_probe_accuracy"] > 0.55
