"""The Hub copies of the image sources, read into the arrays the packaged copies give.

``ylecun/mnist`` and ``zalando-datasets/fashion_mnist`` keep each split as parquet files
(``<config>/<split>-NNNNN-of-NNNNN.parquet``) with an ``image`` column (PNG bytes) and a ``label``
column (the class id, classes in their original order). :func:`hub_image_arrays` reads them into
uint8 pixels ``(n, 28, 28)`` and int64 labels in the files' row order: the same arrays the packaged
IDX files give, so ``data.sources`` builds the same cached splits from either way. For the two
known repos, each split's arrays must match the packaged copy's sha256 (:data:`PACKAGED_SHA256`):
a Hub copy that changed (other rows, order or pixels) is refused rather than read.

WordNet has the packaged way only: the recipe labels and splits by synset offset and lexicographer
file, and no Hub copy has been checked to give the same examples.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import PurePosixPath

import numpy as np

__all__ = ["HUB_COPIES", "PACKAGED_SHA256", "HubCopyUnavailable", "arrays_sha256", "hub_endpoint",
           "hub_image_arrays"]

HUB_COPIES = {"mnist": "ylecun/mnist", "fashion_mnist": "zalando-datasets/fashion_mnist"}

# sha256 of a split's uint8 pixels (n, 28, 28) then int64 labels, as the packaged IDX files give them.
PACKAGED_SHA256 = {
    "ylecun/mnist": {"train": "d18cfd466eb143ac1097fde604dba9eec4116885869d04cc648b510949f9e88c",
                     "test": "a0863a96c44e5666edbb30c4071ee79ca0514c621e6349c5967fc78e7305c891"},
    "zalando-datasets/fashion_mnist": {
        "train": "1f243a60b4b748a44c48b9a6f6907be2a08bee3e4e226f0e86fbde8e147b745a",
        "test": "9a494dc49efeb996f4076c469b31cd058152067b1594ba6ab85dd739fce3775e"},
}

Arrays = dict[str, tuple[np.ndarray, np.ndarray]]


class HubCopyUnavailable(Exception):
    """The Hub copy could not be read (offline, unreachable, missing, or not in the expected form)."""


def arrays_sha256(images: np.ndarray, labels: np.ndarray) -> str:
    """The digest :data:`PACKAGED_SHA256` holds: uint8 pixels, then int64 labels, in row order."""
    digest = hashlib.sha256(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return digest.hexdigest()


def hub_endpoint() -> str:
    """The Hub server ``huggingface_hub`` talks to (``HF_ENDPOINT`` or the public Hub)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def _split_files(files: list[str], split: str) -> list[str]:
    """The parquet files of ``split``: ``<split>-*.parquet``, ``<split>.parquet`` or ``<split>/*.parquet``."""
    out = []
    for name in files:
        path = PurePosixPath(name)
        if path.name.startswith(f"{split}-") or path.stem == split or split in path.parent.parts:
            out.append(name)
    return sorted(out)


def _download(repo_id: str, splits: tuple[str, ...]) -> tuple[dict[str, list[str]], str]:
    """Local paths of each split's parquet files, and the commit they were read at."""
    from huggingface_hub import HfApi, hf_hub_download

    where = f"the Hub copy {repo_id} at {hub_endpoint()}"
    try:
        info = HfApi().dataset_info(repo_id)
        files = sorted(s.rfilename for s in info.siblings or [] if s.rfilename.endswith(".parquet"))
        chosen = {split: _split_files(files, split) for split in splits}
        missing = [split for split, names in chosen.items() if not names]
        if missing:
            raise HubCopyUnavailable(f"{where} has no parquet file for split(s) {', '.join(missing)} "
                                     f"(files: {', '.join(files) or 'none'})")
        paths = {split: [hf_hub_download(repo_id, name, repo_type="dataset", revision=info.sha) for name in names]
                 for split, names in chosen.items()}
    except HubCopyUnavailable:
        raise
    except Exception as err:  # offline mode, no route, refused, 404, 5xx: each is "not reachable this way"
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise HubCopyUnavailable(f"{where} could not be read ({type(err).__name__}: {reason}); reach the Hub "
                                 "(HF_ENDPOINT, HF_HUB_OFFLINE unset) to use it") from err
    return paths, info.sha or "main"


def _decode(repo_id: str, split: str, paths: list[str], shape: tuple[int, int], n_classes: int):
    import pyarrow.parquet as pq
    from PIL import Image

    tables = [pq.read_table(p) for p in paths]
    for t, path in zip(tables, paths):
        if not {"image", "label"} <= set(t.column_names):
            raise HubCopyUnavailable(f"the Hub copy {repo_id}, split {split}: {PurePosixPath(path).name} has "
                                     f"columns {t.column_names}, not image and label")
    encoded = [b for t in tables for b in t.column("image").combine_chunks().field("bytes").to_pylist()]
    labels = np.concatenate([t.column("label").to_numpy() for t in tables]).astype(np.int64)
    images = np.empty((len(encoded), *shape), dtype=np.uint8)
    for i, data in enumerate(encoded):
        with Image.open(io.BytesIO(data)) as im:
            if im.mode != "L" or im.size != shape[::-1]:
                raise HubCopyUnavailable(f"the Hub copy {repo_id}, split {split}, row {i}: a {im.mode} image of "
                                         f"{im.size[0]}x{im.size[1]}, not grayscale {shape[1]}x{shape[0]}")
            images[i] = np.asarray(im)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise HubCopyUnavailable(f"the Hub copy {repo_id}, split {split}: labels outside 0..{n_classes - 1}")
    return images, labels


def hub_image_arrays(repo_id: str, splits: tuple[str, ...], shape: tuple[int, int] = (28, 28),
                     n_classes: int = 10) -> tuple[Arrays, str]:
    """``{split: (images, labels)}`` from the Hub dataset ``repo_id``, and the commit read.

    Raises :class:`HubCopyUnavailable` (one line naming the repo and the server) when the Hub cannot
    be reached, has no such repo or split, holds images of another form, or (for a repo in
    :data:`PACKAGED_SHA256`) other examples than the packaged copy.
    """
    paths, revision = _download(repo_id, splits)
    arrays = {split: _decode(repo_id, split, paths[split], shape, n_classes) for split in splits}
    for split, expected in PACKAGED_SHA256.get(repo_id, {}).items():
        if split in arrays and arrays_sha256(*arrays[split]) != expected:
            raise HubCopyUnavailable(f"the Hub copy {repo_id} at revision {revision}, split {split}, holds other "
                                     "examples than the packaged copy (sha256 of pixels and labels differs)")
    return arrays, revision
