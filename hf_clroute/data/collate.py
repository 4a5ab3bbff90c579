"""Batch collators: lists of examples (dicts from a Dataset / IterableDataset) -> tensors.

* :class:`ImageCollator` -> ``pixel_values`` (B, C, H, W) float32 and ``labels``.
* :class:`TextClassificationCollator` -> tokenizer outputs and ``labels``.
* :class:`CausalLMCollator` -> ``input_ids``, ``attention_mask``, ``labels``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["ImageCollator", "TextClassificationCollator", "CausalLMCollator"]

Example = dict[str, Any]


def _labels(examples: Sequence[Example], column: str) -> torch.Tensor:
    return torch.tensor([int(ex[column]) for ex in examples], dtype=torch.long)


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
    """

    _LUMA = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)

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

    def to_tensor(self, image: Any) -> torch.Tensor:
        """One image -> float (C, H, W) in [0, 1] with ``num_channels`` channels and the target size."""
        if hasattr(image, "convert"):  # PIL: let PIL do mode conversion and high-quality resizing
            image = image.convert("L" if self.num_channels == 1 else "RGB")
            if image.size != self.size[::-1]:
                image = image.resize(self.size[::-1], resample=2)  # 2 = BILINEAR
        array = np.asarray(image)
        scale = 255.0 if np.issubdtype(array.dtype, np.integer) else 1.0
        x = torch.from_numpy(array.astype(np.float32) / scale)
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

    def __call__(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        pixels = torch.stack([self.to_tensor(ex[self.image_column]) for ex in examples])
        return {"pixel_values": (pixels - self.mean) / self.std,
                "labels": _labels(examples, self.label_column)}


class TextClassificationCollator:
    """Texts -> ``input_ids``, ``attention_mask`` (+ ``token_type_ids`` when given), ``labels``.

    Pads to the longest text of the batch (capped at ``max_length``) rather
    than to ``max_length``: short WordNet definitions then cost less compute.
    """

    def __init__(self, tokenizer: Any, max_length: int = 64, text_column: str = "text",
                 label_column: str = "label") -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.text_column = text_column
        self.label_column = label_column

    def __call__(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer([ex[self.text_column] for ex in examples], padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt")
        out = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in batch}
        out["labels"] = _labels(examples, self.label_column)
        return out


class CausalLMCollator:
    """Texts -> ``block_size`` token windows for a causal LM.

    Each text is tokenised without special tokens, cut to its first
    ``block_size`` tokens and right-padded.  ``labels`` equal ``input_ids``
    (transformers shifts them inside the model) except at padding, which is
    -100 so the loss ignores it.  The pad id is the tokenizer's pad token, else
    its EOS token, else 0 (it is never attended to nor scored).
    """

    def __init__(self, tokenizer: Any, block_size: int, text_column: str = "text") -> None:
        if block_size < 2:
            raise ValueError(f"CausalLMCollator: block_size must be >= 2, got {block_size}")
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.text_column = text_column
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = pad if pad is not None else 0

    def __call__(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer([ex[self.text_column] for ex in examples], add_special_tokens=False,
                                 truncation=True, max_length=self.block_size)["input_ids"]
        input_ids = torch.full((len(encoded), self.block_size), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(encoded):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, :len(ids)] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
