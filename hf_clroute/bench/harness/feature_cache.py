"""Frozen-feature caching, and the bare backbone's throughput as a reference.

Methods that only read the frozen backbone's pooled features (NCM, MaRS, a QOA
head) would otherwise run the same frozen forward pass for every method and
every evaluation. The bench computes each example's features once per seed and
gives those methods (``CLModel.reads_frozen_features``) a stream whose batches carry
``features`` instead of pixels or tokens; ``CLModel.extract_features`` passes them through. Results say which
methods ran on cached features (their throughput then excludes the backbone).

Encoding runs under the ``features`` phase's autocast (:mod:`hf_clroute.backbones.precision`: bf16 where it
was measured faster for this backbone); the cached features are float32 either way, and each
cached experience records the choice in ``info["feature_precision"]``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch
from datasets import Dataset
from torch import nn
from torch.utils.data import DataLoader

from hf_clroute.backbones.catalog import (
    get_backbone_spec,
    get_base_model,
    pooled_features,
)
from hf_clroute.backbones.precision import Choice, resolve_for
from hf_clroute.core.outputs import model_inputs
from hf_clroute.data.collate import batch_column, batch_labels
from hf_clroute.data.experiences import Experience

logger = logging.getLogger(__name__)


class FeatureCollator:
    """Batches of cached features: ``{"features": (B, d) float, "labels": (B,)}``, from a list of
    examples or from columns (``takes_columns``).

    The cached datasets are in numpy format, so a batch is one float32 array of the stored
    values, unchanged, rather than a tensor built from nested Python lists.
    """

    takes_columns = True

    def __call__(self, examples: list[dict] | dict[str, Any]) -> dict[str, torch.Tensor]:
        features = np.array(batch_column(examples, "features"), dtype=np.float32)
        return {"features": torch.from_numpy(features), "labels": batch_labels(examples, "label")}


@torch.no_grad()
def encode(backbone: nn.Module, dataset: Dataset, collator: Callable, batch_size: int = 256,
           precision: Choice | str | None = None) -> Dataset:
    """``dataset`` with its inputs replaced by the frozen backbone's pooled features (float32), computed in
    eval mode (no dropout) whatever mode the backbone was in, under the ``features`` phase's autocast
    (``precision``: a resolved choice, or a setting; None = ``$HF_CLROUTE_PRECISION``, else ``auto``);
    the backbone's mode is restored afterwards."""
    base = get_base_model(backbone)
    spec = get_backbone_spec(base)
    choice = precision if isinstance(precision, Choice) else resolve_for(base, "features", batch_size, precision)
    was_training = base.training
    base.eval()
    chunks = []
    try:
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
            inputs = model_inputs(batch)
            with choice.autocast():
                pooled = pooled_features(spec, base(**inputs), inputs.get("attention_mask"))
            chunks.append(pooled.float())
    finally:
        base.train(was_training)
    features = torch.cat(chunks) if chunks else torch.zeros(0)
    return Dataset.from_dict({"features": features.numpy(), "label": list(dataset["label"])}).with_format("numpy")


def cache_stream_features(
    backbone: nn.Module, stream: list[Experience], collator: Callable, precision: str | None = None,
) -> tuple[list[Experience], float]:
    """(the stream with features for inputs, seconds spent encoding)."""
    started = time.perf_counter()
    choice = resolve_for(get_base_model(backbone), "features", 256, precision)
    logger.info(choice.describe())

    def cached(e: Experience) -> Experience:
        info = {**e.info, "feature_precision": choice.to_dict()}
        return replace(e, train=encode(backbone, e.train, collator, precision=choice),
                       test=encode(backbone, e.test, collator, precision=choice), info=info,
                       validation=encode(backbone, e.validation, collator, precision=choice)
                       if e.validation is not None else None)

    return [cached(e) for e in stream], time.perf_counter() - started


def backbone_throughput(
    backbone: nn.Module, experience: Experience, collator: Callable, batch_size: int, steps: int = 20
) -> dict[str, float]:
    """Samples/s of the bare backbone: forward+backward at the training batch size, and
    forward at the same batch size, after 3 warm-up batches, each under its phase's autocast
    (``train``, ``eval``). The reference for overheads."""
    base = get_base_model(backbone)
    spec = get_backbone_spec(base)
    loader = DataLoader(experience.train, batch_size=batch_size, collate_fn=collator)
    batches = [b for _, b in zip(range(steps + 3), loader)]
    if len(batches) <= 3:
        return {}

    # The same autocast as the trainer's phases, so the reference does the work the loop does.
    choices = {train: resolve_for(base, "train" if train else "eval", batch_size) for train in (True, False)}

    def run(train: bool) -> float:
        base.train(train)
        seen, elapsed = 0, 0.0
        for i, batch in enumerate(batches):
            inputs = model_inputs(batch)
            start = time.perf_counter()
            with torch.set_grad_enabled(train):
                with choices[train].autocast():
                    out = pooled_features(spec, base(**inputs), inputs.get("attention_mask"))
                if train:
                    out.float().pow(2).mean().backward()
            if i >= 3:
                elapsed += time.perf_counter() - start
                seen += out.shape[0]
        base.zero_grad(set_to_none=True)
        return seen / elapsed if elapsed else 0.0

    return {"train_samples_per_s": run(True), "infer_samples_per_s": run(False)}
