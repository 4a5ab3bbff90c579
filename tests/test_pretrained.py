"""The stand-in pretrained ViT (issue 3): a tiny build is a loadable checkpoint with a report,
and a recipe never reads the target stream's labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_clroute.bench import pretrained
from hf_clroute.bench.pretrained import RECIPES, frozen_probe_report, pretrained_vit_path

TINY = dict(steps=20, limit=256, batch_size=32, target_batch_size=32, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, probe_train_limit=256, probe_test_limit=128)


@pytest.fixture()
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private model cache; the data sources stay where they are (already built)."""
    from hf_clroute.data import sources

    data_cache = sources.cache_dir()
    monkeypatch.setattr(pretrained, "models_dir", lambda: tmp_path / "models")
    assert sources.cache_dir() == data_cache
    return tmp_path / "models"


def test_recipes_disjoint_source_and_target():
    assert set(RECIPES) == {"vit-mnist-stream", "vit-fashion-stream"}
    for recipe in RECIPES.values():
        assert recipe.source != recipe.target
    assert RECIPES["vit-mnist-stream"].target == "mnist"
    assert RECIPES["vit-fashion-stream"].target == "fashion_mnist"


def test_tiny_build_is_a_loadable_checkpoint(tmp_cache: Path):
    from transformers import AutoImageProcessor, ViTForImageClassification

    with pytest.raises(FileNotFoundError):
        pretrained_vit_path("vit-mnist-stream", build=False)
    path = pretrained_vit_path("vit-mnist-stream", **TINY)
    assert Path(path) == tmp_cache / "vit-mnist-stream"
    assert [p.name for p in tmp_cache.iterdir()] == ["vit-mnist-stream"]  # no temp dir left behind
    assert pretrained_vit_path("vit-mnist-stream", build=False) == path  # cached: no rebuild

    model = ViTForImageClassification.from_pretrained(path)
    processor = AutoImageProcessor.from_pretrained(path)
    assert model.config.num_channels == 1 and model.config.image_size == 28
    assert model.config.id2label[0] == "T-shirt/top"  # the head is the labelled source's (Fashion-MNIST)
    assert list(processor.image_mean) == [0.5] and list(processor.image_std) == [0.5]

    # The processor turns a grayscale 28x28 image into what the model takes.
    from PIL import Image

    image = Image.fromarray((torch.rand(28, 28) * 255).byte().numpy(), mode="L")
    pixels = processor(images=image, return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 1, 28, 28)
    assert model(pixel_values=pixels).logits.shape == (1, 10)

    report = json.loads((Path(path) / "pretrain_report.json").read_text())
    for key in ("objective", "steps", "train_seconds", "source_test_accuracy", "target_probe", "recipe",
                "num_parameters", "target_labels_used"):
        assert key in report, key
    assert report["steps"] == 20 and report["target_labels_used"] is False
    assert report["recipe"]["target"] == "mnist"
    assert "vit-mnist-stream" in (Path(path) / "README.md").read_text()  # Hub-ready model card
    probe = report["target_probe"]
    assert probe["dataset"] == "mnist" and probe["n_test"] == 128
    assert 0.0 <= probe["ncm_accuracy"] <= 1.0 and 0.0 <= probe["linear_probe_accuracy"] <= 1.0


def test_target_loader_has_no_labels():
    train = pretrained._train_module()
    data = train.get_dataloaders(None, "vit-fashion-stream", batch_size=16, limit=64)
    target = next(iter(data["target_unlabeled"]))
    assert set(target) == {"pixel_values"}  # the Fashion-MNIST stream's labels never load
    assert target["pixel_values"].dtype == torch.uint8 and target["pixel_values"].shape == (16, 28, 28)
    source = next(iter(data["source_train"]))
    assert set(source) == {"pixel_values", "labels"}
    assert data["source_label_names"] == [str(d) for d in range(10)]  # labelled source = MNIST


def test_load_images_without_labels_never_reads_them(monkeypatch: pytest.MonkeyPatch):
    """with_labels=False drops the label column before any row is read."""
    import datasets

    read = []
    original = datasets.Dataset.__getitem__

    def spy(self, key):
        if key == "label" or (isinstance(key, str) and "label" in self.column_names):
            read.append(key)
        return original(self, key)

    monkeypatch.setattr(datasets.Dataset, "__getitem__", spy)
    images, labels = pretrained.load_images("mnist", "train", with_labels=False, limit=32)
    assert labels is None and images.shape == (32, 28, 28) and read == []


def test_probes_on_separable_features():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 8, generator=g) * 5
    y = torch.arange(300) % 3
    x = centers[y] + torch.randn(300, 8, generator=g)
    assert pretrained.ncm_accuracy(x[:200], y[:200], x[200:], y[200:]) > 0.95
    assert pretrained.linear_probe_accuracy(x[:200], y[:200], x[200:], y[200:]) > 0.95


def test_frozen_probe_report_needs_stats_for_a_loaded_model():
    with pytest.raises(ValueError):
        frozen_probe_report(torch.nn.Identity(), "mnist")
