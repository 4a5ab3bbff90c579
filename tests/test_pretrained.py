"""The stand-in pretrained ViT (issue 3): a tiny build is a loadable checkpoint with a report,
a recipe never reads the target stream's labels, and the committed assets (issue 25) install
byte-identical to the build they were made from, refusing any file whose sha256 differs."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
import torch

from hf_clroute.backbones.pretraining import recipes as pretrained
from hf_clroute.backbones.pretraining import vit as pretrain_vit
from hf_clroute.backbones.pretraining.recipes import RECIPES, frozen_probe_report
from hf_clroute.backbones.pretraining.vit import pretrained_vit_path


def load_training_script():
    """``training/pretrain_vit.py``, the command line over :mod:`hf_clroute.backbones.pretraining.vit`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "pretrain_vit_script", Path(__file__).resolve().parents[1] / "training" / "pretrain_vit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert set(RECIPES) == {"vit-mnist-stream", "vit-fashion-stream", "vit-mnist-r-stream"}
    for recipe in RECIPES.values():
        assert recipe.source != recipe.target
    assert RECIPES["vit-mnist-stream"].target == "mnist"
    assert RECIPES["vit-fashion-stream"].target == "fashion_mnist"
    # the room suite's backbone never sees a digit: its labelled and unlabelled data are both Fashion-MNIST
    room = RECIPES["vit-mnist-r-stream"]
    assert room.target == "mnist_r" and room.source == "fashion_mnist" and room.unlabelled == "fashion_mnist"


def test_tiny_build_is_a_loadable_checkpoint(tmp_cache: Path):
    from transformers import AutoImageProcessor, ViTForImageClassification

    with pytest.raises(FileNotFoundError):
        pretrained_vit_path("vit-mnist-stream", build=False, use_asset=False)
    path = pretrained_vit_path("vit-mnist-stream", **TINY)
    assert Path(path) == tmp_cache / "vit-mnist-stream"
    assert [p.name for p in tmp_cache.iterdir()] == ["vit-mnist-stream"]  # no temp dir left behind
    # cached: no rebuild (use_asset=False: with the committed asset wanted, a cached build that differs from it
    # is replaced by it, so an older build never stands in for the asset)
    assert pretrained_vit_path("vit-mnist-stream", build=False, use_asset=False) == path

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


def test_training_script_writes_an_asset_that_installs_byte_identical(tmp_cache: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """`pretrain_vit.py --asset ROOT` stores the build; pretrained_vit_path installs it with no training."""
    train = load_training_script()
    out, root = tmp_path / "built", tmp_path / "assets"
    train.main(["--recipe", "vit-mnist-stream", "--out", str(out), "--steps", "3", "--limit", "64",
                "--batch-size", "16", "--asset", str(root)])
    asset = root / "vit-mnist-stream"
    assert sorted(p.name for p in asset.iterdir()) == sorted(
        ["SHA256SUMS", "config.json", "preprocessor_config.json", "model.safetensors.xz", "pretrain_report.json",
         "README.md"])
    assert lzma.decompress((asset / "model.safetensors.xz").read_bytes()) == (out / "model.safetensors").read_bytes()

    monkeypatch.setattr(pretrained, "assets_root", lambda: root)
    monkeypatch.setattr(pretrain_vit, "training_function", lambda *a, **k: pytest.fail("the asset must not be rebuilt"))
    path = Path(pretrained_vit_path("vit-mnist-stream", build=False))
    assert path == tmp_cache / "vit-mnist-stream"
    for name in pretrained.ASSET_FILES:
        assert (path / name).read_bytes() == (out / name).read_bytes(), name
    assert not pretrained.asset_dir("vit-fashion-stream")  # no asset of that recipe under this root
    with pytest.raises(FileNotFoundError, match="not built"):
        pretrained_vit_path("vit-fashion-stream", build=False)

    # A damaged asset is refused naming the file, and leaves nothing under the final name.
    config = json.loads((asset / "config.json").read_text())
    (asset / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    monkeypatch.setattr(pretrained, "models_dir", lambda: tmp_path / "fresh")
    with pytest.raises(ValueError, match=r"config\.json has sha256 [0-9a-f]{64}, but SHA256SUMS says"):
        pretrained_vit_path("vit-mnist-stream")
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == []


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_committed_asset_is_the_default_recipe(recipe: str, tmp_cache: Path):
    """The package ships each recipe built with the script's current defaults, and it verifies."""
    from transformers import ViTForImageClassification

    asset = pretrained.asset_dir(recipe)
    assert asset is not None, f"no committed asset for {recipe}: run training/pretrain_vit.py --asset"
    path = pretrained_vit_path(recipe, build=False)  # raises unless every sha256 matches
    report = pretrained.read_report(path)
    expected = {**pretrain_vit.DEFAULTS, **(RECIPES[recipe].settings or {})}
    assert report["settings"] == expected, "defaults changed: rebuild the asset"
    assert report["recipe"] == RECIPES[recipe].to_dict() and report["target_labels_used"] is False
    model = ViTForImageClassification.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == report["num_parameters"]


def test_target_loader_has_no_labels():
    train = pretrain_vit
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
