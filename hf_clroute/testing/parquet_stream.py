"""A synthetic image stream as parquet shards, for the streaming tests and the memory table."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np


def write_parquet_stream(directory: str | Path, per_class: int, shards: int, side: int = 16, classes: int = 4,
                         test_per_class: int = 4, noise: int = 160, seed: int = 0) -> int:
    """``train-*.parquet`` / ``test-*.parquet`` shards (the Hub's layout) of RGB PNG images whose
    brightness tells the class: ``per_class`` training rows of each class (``test_per_class`` test
    rows), in a seeded shuffled order, the label a ``ClassLabel``. Returns the bytes written.

    The pixels are noise over ``noise`` levels, so the PNGs barely compress: ``side`` sets the
    stream's size on disk (about ``3 * side**2`` bytes a row).
    """
    import PIL.Image
    from datasets import ClassLabel, Dataset, Features, Image

    directory = Path(directory)
    rng = np.random.default_rng(seed)
    features = Features({"image": Image(), "label": ClassLabel(names=[f"class{c}" for c in range(classes)])})
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", per_class), ("test", test_per_class)):
        labels = rng.permutation(np.repeat(np.arange(classes), n))
        images = []
        for label in labels:
            pixels = rng.integers(0, noise, (side, side, 3)) + label * (255 - noise) // max(classes - 1, 1)
            buffer = io.BytesIO()
            PIL.Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
            images.append({"bytes": buffer.getvalue(), "path": None})
        data = Dataset.from_dict({"image": images, "label": labels.tolist()}, features=features)
        count = min(shards, len(data))  # a small test split gets fewer shards
        for shard in range(count):
            data.shard(count, shard, contiguous=True).to_parquet(str(directory / f"{split}-{shard:05d}.parquet"))
    return sum(p.stat().st_size for p in directory.glob("*.parquet"))
