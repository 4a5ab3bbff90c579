"""Batch collators: examples (dicts from a Dataset / IterableDataset) -> tensors.

Each takes a list of examples, or a batch as columns (``{"image": [...], "label": [...]}``,
what ``dataset[i:j]`` returns; ``takes_columns = True``), with the same result: the trainer
hands its batches over as the column slices of a chunked read, with no per-row dicts.

* :class:`ImageCollator` -> ``pixel_values`` (B, C, H, W) float32 and ``labels``.
* :class:`TextClassificationCollator` -> tokenizer outputs and ``labels``.
* :class:`CausalLMCollator` -> ``input_ids``, ``attention_mask``, ``labels``.

:func:`decode_images` / :func:`decode_stream` decode a dataset's PNG/JPEG images once,
into the uint8 arrays :class:`ImageCollator` would make of them on every pass (same
PIL calls), so later passes skip PIL and give bit-identical ``pixel_values``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

__all__ = [
    "CausalLMCollator", "ImageCollator", "TextClassificationCollator", "decode_images", "decode_stream",
    "decode_stream_if_small",
]

Example = dict[str, Any]
Batch = Sequence[Example] | Mapping[str, Sequence[Any]]


def batch_column(examples: Batch, name: str) -> Sequence[Any]:
    """One column of a batch given as a list of examples or as columns."""
    if isinstance(examples, Mapping):
        return examples[name]
    return [ex[name] for ex in examples]


def batch_labels(examples: Batch, column: str) -> torch.Tensor:
    values = batch_column(examples, column)
    if isinstance(values, np.ndarray) and np.issubdtype(values.dtype, np.integer):
        return torch.from_numpy(values.astype(np.int64))
    return torch.tensor([int(v) for v in values], dtype=torch.long)


def _texts(examples: Batch, column: str) -> list[str]:
    values = batch_column(examples, column)
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _per_channel(value: float | Sequence[float], channels: int, what: str) -> torch.Tensor:
    """Broadcastable (C, 1, 1) tensor from a scalar or a per-channel sequence."""
    values = [float(value)] * channels if np.isscalar(value) else [float(v) for v in value]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"ImageCollator: {what} has {len(values)} values for {channels} channels")
    return torch.tensor(values, dtype=torch.float32).view(channels, 1, 1)


class ImageCollator:
    """Images (PIL, arrays or nested lists; gray or RGB) -> normalised ``pixel_values``.

    Integer pixels are scaled from [0, 255] to [0, 1], float pixels are taken
    as already in [0, 1]; channels are converted to ``num_channels``
    (gray -> RGB by repetition, RGB -> gray by ITU-R 601 luma), images are
    resized (bilinear, antialiased) when their size differs, then
    ``(x - mean) / std`` is applied per channel.

    Arrays are read as (H, W) or (H, W, C); torch tensors also as (C, H, W), the
    layout of ``Dataset.with_format("torch")``. A batch whose images are all
    arrays (or tensors) of the target size and channels -- PIL images once
    converted and resized, or a dataset from :func:`decode_images` -- is converted
    in one step, with the same arithmetic as image by image: the same numbers.
    """

    _LUMA = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    takes_columns = True

    def __init__(self, image_size: int | tuple[int, int], num_channels: int = 1,
                 mean: float | Sequence[float] = 0.5, std: float | Sequence[float] = 0.5,
                 image_column: str = "image", label_column: str = "label") -> None:
        self.size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if num_channels not in (1, 3):
            raise ValueError(f"ImageCollator: num_channels must be 1 or 3, got {num_channels}")
        self.num_channels = num_channels
        self.mean = _per_channel(mean, num_channels, "mean")
        self.std = _per_channel(std, num_channels, "std")
        self.image_column = image_column
        self.label_column = label_column

    @classmethod
    def from_processor(cls, image_processor: Any, **kwargs: Any) -> ImageCollator:
        """Read size, mean and std from a transformers image processor (e.g. ``ViTImageProcessor``)."""
        size = image_processor.size
        if isinstance(size, dict) or hasattr(size, "get"):
            size = size.get("shortest_edge") or (size["height"], size["width"])
        normalize = getattr(image_processor, "do_normalize", True)
        mean = image_processor.image_mean if normalize else 0.0
        std = image_processor.image_std if normalize else 1.0
        channels = kwargs.pop("num_channels", None) or (1 if np.isscalar(mean) else len(mean))
        return cls(size, num_channels=channels, mean=mean, std=std, **kwargs)

    def pil_array(self, image: Any) -> np.ndarray:
        """A PIL image converted to ``num_channels`` and resized to the target size by PIL:
        uint8 (H, W) or (H, W, 3), what :meth:`to_tensor` scales to [0, 1]."""
        mode = "L" if self.num_channels == 1 else "RGB"
        if image.mode != mode:  # convert() to the same mode would only copy
            image = image.convert(mode)
        if image.size != self.size[::-1]:
            image = image.resize(self.size[::-1], resample=2)  # 2 = BILINEAR
        return np.asarray(image)

    def to_tensor(self, image: Any) -> torch.Tensor:
        """One image -> float (C, H, W) in [0, 1] with ``num_channels`` channels and the target size."""
        chw = _is_chw(image)
        if hasattr(image, "convert"):  # PIL: let PIL do mode conversion and high-quality resizing
            image = self.pil_array(image)
        array = image.numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
        scale = 255.0 if np.issubdtype(array.dtype, np.integer) else 1.0
        x = torch.from_numpy(array.astype(np.float32) / scale)
        if not chw:
            x = x.unsqueeze(0) if x.ndim == 2 else x.permute(2, 0, 1)  # HW or HWC -> CHW
        x = self._convert_channels(x)
        if tuple(x.shape[1:]) != self.size:
            x = F.interpolate(x.unsqueeze(0), size=self.size, mode="bilinear", antialias=True,
                              align_corners=False).squeeze(0)
        return x

    def _convert_channels(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 4:  # drop alpha
            x = x[:3]
        if x.shape[0] == self.num_channels:
            return x
        if self.num_channels == 3:
            return x.expand(3, -1, -1)
        return (x * self._LUMA).sum(0, keepdim=True)

    def __call__(self, examples: Batch) -> dict[str, torch.Tensor]:
        images = batch_column(examples, self.image_column)
        if not _stacked(images):  # a stacked column of decoded images is ready as it is
            images = [self.pil_array(im) if hasattr(im, "convert") else im for im in images]
        pixels = self._ready_batch(images)
        if pixels is None:
            pixels = torch.stack([self.to_tensor(im) for im in images])
        # In place on the fresh batch: the same two operations as (pixels - mean) / std, no new buffers.
        return {"pixel_values": pixels.sub_(self.mean).div_(self.std),
                "labels": batch_labels(examples, self.label_column)}

    def _ready_batch(self, images: list[Any] | np.ndarray) -> torch.Tensor | None:
        """(B, C, H, W) floats in [0, 1] when every image is an array (or tensor) of one dtype
        already at the target size and channels, else None (then :meth:`to_tensor` per image).
        ``images`` may also be them stacked, (B, H, W) or (B, H, W, C): a column in numpy format.

        Elementwise the same ``astype(float32) / scale`` as :meth:`to_tensor`, on the stacked
        batch: identical values, without a Python-level pass per image.
        """
        if _stacked(images):
            return self._scaled(images, images[0]) if len(images) else None
        if not len(images) or not all(isinstance(im, (np.ndarray, torch.Tensor)) for im in images):
            return None
        first = images[0]
        if any(type(im) is not type(first) or im.shape != first.shape or im.dtype != first.dtype for im in images):
            return None
        return self._scaled(torch.stack(images).numpy() if isinstance(first, torch.Tensor) else np.stack(images), first)

    def _scaled(self, array: np.ndarray, first: Any) -> torch.Tensor | None:
        """The stacked images ``array`` (each like ``first``) as (B, C, H, W) floats in [0, 1], or
        None when they are not at the target size and channels."""
        shape = tuple(first.shape)
        h, w = self.size
        if shape == (h, w) and self.num_channels == 1:
            layout = "hw"
        elif shape == (h, w, self.num_channels) and not _is_chw(first):
            layout = "hwc"
        elif _is_chw(first) and shape == (self.num_channels, h, w):
            layout = "chw"
        else:
            return None
        scale = 255.0 if np.issubdtype(array.dtype, np.integer) else 1.0
        if layout == "hw":
            array = array[:, None]
        elif layout == "hwc":
            array = array.transpose(0, 3, 1, 2)  # moved while casting below: one pass over the pixels
        x = array.astype(np.float32, order="C")
        x /= scale
        return torch.from_numpy(x)


def _stacked(images: Any) -> bool:
    """Images stacked in one numeric array (a fixed-size array column read in numpy format)."""
    return isinstance(images, np.ndarray) and images.dtype != object


def _is_chw(image: Any) -> bool:
    """A torch image tensor laid out (C, H, W), as ``with_format("torch")`` gives them."""
    return (isinstance(image, torch.Tensor) and image.ndim == 3 and image.shape[0] in (1, 3, 4)
            and image.shape[-1] not in (1, 3, 4))


def decode_images(dataset: Any, collator: ImageCollator, *, chunk_size: int = 4096) -> Any:
    """``dataset`` with its image column decoded once, ready for ``collator``.

    Each image is decoded by the dataset's own ``Image`` feature and converted and
    resized by the collator's own PIL calls (:meth:`ImageCollator.pil_array`), then
    stored as uint8 (``Array2D`` (H, W) for gray, ``Array3D`` (H, W, 3) for RGB): the
    collator then skips PIL and gives ``pixel_values`` bit-identical to the PNG/JPEG
    path, pass after pass. Rows and every other column are unchanged. Returned in
    numpy format (unless ``dataset`` had a format), so batched reads hand the
    collator arrays rather than nested lists. It is held in memory:
    ``len(dataset) * H * W * C`` bytes (5.5 MB for 7k MNIST digits at 28x28 gray, 150 kB
    per image at 224x224 RGB), so decode what is read repeatedly, not a whole ImageNet.
    A column that is not an ``Image`` feature is left as it is.
    """
    from datasets import Array2D, Array3D, Dataset, Image
    from datasets.table import InMemoryTable

    column = collator.image_column
    feature = dataset.features[column]
    if not isinstance(feature, Image):
        return dataset
    h, w = collator.size
    shape = (h, w) if collator.num_channels == 1 else (h, w, 3)
    features = dataset.features.copy()
    features[column] = (Array2D if len(shape) == 2 else Array3D)(shape=shape, dtype="uint8")
    schema = features.arrow_schema
    raw = dataset.select_columns([column]).with_format("arrow")[:].column(column).to_pylist()
    chunk_size = max(1, min(chunk_size, (2**31 - 1) // int(np.prod(shape))))  # int32 list offsets
    chunks = []
    for start in range(0, len(raw), chunk_size):
        part = raw[start:start + chunk_size]
        pixels = np.stack([_decoded(dataset, start + i, collator, feature, v) for i, v in enumerate(part)])
        chunks.append(pa.ExtensionArray.from_storage(schema.field(column).type, _nested_lists(pixels)))
    rest = [name for name in dataset.column_names if name != column]
    # One chunk per column: rows picked out of order (a shuffled stream) arrive in one chunk per row,
    # and arrow batches, hence chunked reads, would stop at every chunk boundary.
    others = dataset.select_columns(rest).with_format("arrow")[:].combine_chunks() if rest else None
    columns = [pa.chunked_array(chunks, type=schema.field(column).type) if name == column else others.column(name)
               for name in dataset.column_names]
    table = pa.Table.from_arrays(columns, schema=schema)
    info = dataset.info.copy()
    info.features = features
    decoded = Dataset(InMemoryTable(table), info=info, split=dataset.split)
    fmt = dataset.format
    if fmt["type"] is None:
        return decoded.with_format("numpy")
    return decoded.with_format(fmt["type"], columns=fmt["columns"], output_all_columns=fmt["output_all_columns"],
                               **fmt["format_kwargs"])


def _decoded(dataset: Any, row: int, collator: ImageCollator, feature: Any, value: Any) -> np.ndarray:
    """One image as ``collator`` holds it; an image PIL cannot read is an error naming the dataset, the
    split and the row (the row of the dataset as stored, also when ``dataset`` is a selection of it)."""
    from hf_clroute.errors import UserInputError

    try:
        return collator.pil_array(feature.decode_example(value)).astype(np.uint8)
    except (OSError, ValueError, SyntaxError) as err:  # PIL's errors for a truncated or non-image file
        indices = getattr(dataset, "_indices", None)  # a select()ed dataset: the row it came from
        stored = indices.column(0)[row].as_py() if indices is not None else row
        name = dataset.info.dataset_name or "the dataset"
        detail = "not an image file PIL can identify" if "<_io." in str(err) else str(err)  # no object reprs
        raise UserInputError(f"dataset {name!r}, split {str(dataset.split or '?')!r}, row {stored}: column "
                             f"{collator.image_column!r} holds an image that cannot be decoded "
                             f"({type(err).__name__}: {detail})") from err


def _nested_lists(pixels: np.ndarray) -> pa.Array:
    """(N, *shape) -> the nested arrow lists of an ``ArrayND`` column's storage (zero-copy values)."""
    array: pa.Array = pa.array(np.ascontiguousarray(pixels).reshape(-1))
    for size in reversed(pixels.shape[1:]):
        array = pa.ListArray.from_arrays(pa.array(np.arange(0, len(array) + 1, size, dtype=np.int32)), array)
    return array


def decode_stream(experiences: Sequence[Any], collator: ImageCollator) -> list[Any]:
    """Every experience with its train, test (and validation) images decoded once by
    :func:`decode_images`: the same stream, the same numbers, no image decoded twice.
    Worth it when images are read more than once (evaluations, epochs, replay, several
    methods on one stream); it costs the decoding of one pass, up front."""
    out = []
    for e in experiences:
        validation = None if e.validation is None else decode_images(e.validation, collator)
        out.append(dataclasses.replace(e, train=decode_images(e.train, collator),
                                       test=decode_images(e.test, collator), validation=validation))
    return out


def decoded_size_mb(experiences: Sequence[Any], collator: ImageCollator) -> float:
    """What :func:`decode_stream` would hold in memory for ``experiences`` (MB)."""
    h, w = collator.size
    rows = sum(len(split) for e in experiences for split in (e.train, e.test, e.validation) if split is not None)
    return rows * h * w * (1 if collator.num_channels == 1 else 3) / 2**20


def decode_stream_if_small(experiences: Sequence[Any], collator: Any, max_mb: float = 1024.0) -> list[Any]:
    """:func:`decode_stream` when ``collator`` reads images from an ``Image`` column and the decoded
    stream fits in ``max_mb``; else the stream as it is (text, cached features, arrays, or too large).

    The bench runs every method, evaluation and probe of a seed on one stream, so decoding
    it once replaces a PNG decode per image per pass; the numbers are the same.
    """
    from datasets import Image

    experiences = list(experiences)
    if not isinstance(collator, ImageCollator) or not experiences:
        return experiences
    train = experiences[0].train
    features = getattr(train, "features", None)
    if not features or not isinstance(features.get(collator.image_column), Image) or not hasattr(train, "select"):
        return experiences
    if decoded_size_mb(experiences, collator) > max_mb:
        return experiences
    return decode_stream(experiences, collator)


class TextClassificationCollator:
    """Texts -> ``input_ids``, ``attention_mask`` (+ ``token_type_ids`` when given), ``labels``.

    Pads to the longest text of the batch (capped at ``max_length``) rather
    than to ``max_length``: short WordNet definitions then cost less compute.
    """

    takes_columns = True

    def __init__(self, tokenizer: Any, max_length: int = 64, text_column: str = "text",
                 label_column: str = "label") -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.text_column = text_column
        self.label_column = label_column

    def __call__(self, examples: Batch) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(_texts(examples, self.text_column), padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt")
        out = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in batch}
        out["labels"] = batch_labels(examples, self.label_column)
        return out


class CausalLMCollator:
    """Texts -> ``block_size`` token windows for a causal LM.

    Each text is tokenised without special tokens, cut to its first
    ``block_size`` tokens and right-padded.  ``labels`` equal ``input_ids``
    (transformers shifts them inside the model) except at padding, which is
    -100 so the loss ignores it.  The pad id is the tokenizer's pad token, else
    its EOS token, else 0 (it is never attended to nor scored).
    """

    takes_columns = True

    def __init__(self, tokenizer: Any, block_size: int, text_column: str = "text") -> None:
        if block_size < 2:
            raise ValueError(f"CausalLMCollator: block_size must be >= 2, got {block_size}")
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.text_column = text_column
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = pad if pad is not None else 0

    def __call__(self, examples: Batch) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(_texts(examples, self.text_column), add_special_tokens=False,
                                 truncation=True, max_length=self.block_size)["input_ids"]
        input_ids = torch.full((len(encoded), self.block_size), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(encoded):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, :len(ids)] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
