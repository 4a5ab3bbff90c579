"""Renditions: an image source redrawn in other styles, the 28x28 analogue of ImageNet-R.

ImageNet-R keeps ImageNet's classes and draws them as art, cartoons and sketches, so a
backbone pretrained on photos has to adapt. Here every MNIST (or Fashion-MNIST) image is
redrawn in one of :data:`STYLES`:

* ``edges``: the gradient magnitude of the strokes, a hollow outline;
* ``inverted``: a dark figure on a light background of random brightness;
* ``blur``: a wide Gaussian smudge at reduced contrast;
* ``painted``: the figure filled with a striped paint over a smooth random texture;
* ``stipple``: the figure as scattered dots;
* ``elastic``: a strong elastic distortion of the strokes (Simard et al.'s, alpha 30-40).

The style and its parameters are drawn from a generator seeded by the base source, the
split and the example's index (:func:`example_rng`), so a rendition is the same on every
machine and every build, and :func:`render` redraws any single example exactly. Train and
test renditions come from the base source's train and test images: the split stays disjoint.

Only numpy is used (blur as separable Gaussian matrices, elastic warps by bilinear sampling),
so building the sources needs no image library beyond PIL's PNG encoder.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
from datasets import ClassLabel, Dataset, Features, Image

__all__ = ["STYLES", "RENDITION_SEED", "example_rng", "render", "render_images", "rendition_splits"]

STYLES = ("edges", "inverted", "blur", "painted", "stipple", "elastic")
RENDITION_SEED = 20261203  # fixed: part of every example's generator seed, so builds repeat
SPLITS = ("train", "test")  # the sources' splits, in the order their index enters the seed


def example_rng(base: str, split: str, index: int) -> np.random.Generator:
    """The generator of one example's rendition: seeded by (base source, split, index) alone."""
    return np.random.default_rng([RENDITION_SEED, zlib.crc32(base.encode()), SPLITS.index(split), index])


# --------------------------------------------------------------------------- numpy image operations


def _gaussian_matrix(n: int, sigma: float) -> np.ndarray:
    """(n, n) matrix G with ``G @ x`` a Gaussian blur of x's columns (rows renormalised at the borders)."""
    pos = np.arange(n)
    g = np.exp(-0.5 * ((pos[:, None] - pos[None, :]) / sigma) ** 2)
    return g / g.sum(1, keepdims=True)


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    g = _gaussian_matrix(x.shape[0], sigma)
    return g @ x @ g.T  # square images: the same matrix for rows and columns


def _sample(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Bilinear sampling of ``x`` at float coordinates; outside the image reads 0."""
    h, w = x.shape
    padded = np.pad(x, 1)
    r = np.clip(rows, -1, h) + 1
    c = np.clip(cols, -1, w) + 1
    r0 = np.clip(np.floor(r).astype(int), 0, h)
    c0 = np.clip(np.floor(c).astype(int), 0, w)
    fr, fc = r - r0, c - c0
    return ((1 - fr) * (1 - fc) * padded[r0, c0] + (1 - fr) * fc * padded[r0, c0 + 1]
            + fr * (1 - fc) * padded[r0 + 1, c0] + fr * fc * padded[r0 + 1, c0 + 1])


def _normalise(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


# --------------------------------------------------------------------------- styles (x: float in [0, 1], figure bright)


def _edges(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    gy, gx = np.gradient(_blur(x, rng.uniform(0.6, 1.0)))
    return _normalise(np.hypot(gx, gy)) * rng.uniform(0.7, 1.0)


def _inverted(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    background, figure = rng.uniform(0.6, 1.0), rng.uniform(0.0, 0.3)
    return background + (figure - background) * x


def _blurred(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return _normalise(_blur(x, rng.uniform(1.2, 2.0))) * rng.uniform(0.4, 0.8)


def _painted(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = x.shape
    texture = _normalise(_blur(rng.standard_normal((h, w)), rng.uniform(1.5, 3.0)))
    background = rng.uniform(0.1, 0.3) + rng.uniform(0.3, 0.5) * texture
    angle, period = rng.uniform(0, np.pi), rng.uniform(2.5, 5.0)
    rows, cols = np.mgrid[0:h, 0:w]
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * (rows * np.sin(angle) + cols * np.cos(angle)) / period
                                 + rng.uniform(0, 2 * np.pi))
    paint = rng.uniform(0.6, 1.0) * (0.4 + 0.6 * stripes)
    return (1 - x) * background + x * paint


def _stipple(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    dots = rng.random(x.shape) < rng.uniform(0.3, 0.55)
    return _blur(x * dots, 0.5) * rng.uniform(1.2, 1.6)


def _elastic(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = x.shape
    alpha, sigma = rng.uniform(30, 40), 4.0
    dr = _blur(rng.uniform(-1, 1, (h, w)), sigma) * alpha
    dc = _blur(rng.uniform(-1, 1, (h, w)), sigma) * alpha
    rows, cols = np.mgrid[0:h, 0:w].astype(float)
    return _sample(x, rows + dr, cols + dc)


_RENDER = {"edges": _edges, "inverted": _inverted, "blur": _blurred, "painted": _painted,
           "stipple": _stipple, "elastic": _elastic}
assert tuple(_RENDER) == STYLES


def render(image: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """One rendition of a uint8 (H, W) image: (uint8 image, index into :data:`STYLES`).

    The style is drawn first, then its parameters, all from ``rng``
    (:func:`example_rng` for a source's example)."""
    style = int(rng.integers(len(STYLES)))
    out = _RENDER[STYLES[style]](image.astype(np.float64) / 255.0, rng)
    return np.round(np.clip(out, 0.0, 1.0) * 255.0).astype(np.uint8), style


def render_images(images: np.ndarray, base: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Render a split's (N, H, W) uint8 images, example i with :func:`example_rng` (base, split, i)."""
    pairs = [render(image, example_rng(base, split, i)) for i, image in enumerate(images)]
    return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=np.int64)


def rendition_splits(base: str, splits: dict[str, Dataset], png: Callable[[np.ndarray], bytes]) -> dict[str, Dataset]:
    """The ``train``/``test`` ``splits`` of source ``base`` rendered: ``image``, ``label`` (the base's
    classes) and ``style`` (which rendition; loaders drop it, analyses may read it). ``png`` encodes
    an image; the caller (``data.sources``) passes the base's splits and its encoder, so this module
    imports nothing from there."""
    out = {}
    for split in SPLITS:
        ds = splits[split]
        pixels = np.asarray(ds.with_format("numpy", columns=["image"])[:]["image"])
        images, styles = render_images(pixels, base, split)
        features = Features({"image": Image(), "label": ds.features["label"], "style": ClassLabel(names=list(STYLES))})
        out[split] = Dataset.from_dict(
            {"image": [{"bytes": png(im), "path": None} for im in images],
             "label": np.asarray(ds["label"], dtype=np.int64), "style": styles}, features=features)
    return out
