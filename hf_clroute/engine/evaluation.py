"""Evaluation of a continual model on one experience's test split.

Runs on every process under Accelerate: each process scores its shard and
``gather_for_metrics`` drops the samples that were duplicated to even out the
last batch, so the number is the same with 1 or N processes.

A test split does not change during a run, so its collated batches are kept from
one evaluation to the next (:class:`EvalCache`, bounded in examples per split and
in memory overall): the same tensors, so the same scores, without reading,
decoding and collating the split again at every evaluation. For a model whose
classifier reads only the frozen backbone's features, the features themselves are
kept (:func:`feature_batches`): later evaluations run the head alone.

Both run under the autocast of their phase (``eval``, ``features``; :mod:`hf_clroute.backbones.precision`):
kept features are stored as float32 whatever the autocast, so the head that reads them later sees
what it would have seen in one pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hf_clroute.backbones.precision import Choice, resolve_for
from hf_clroute.core.model import CLModel
from hf_clroute.core.outputs import model_inputs
from hf_clroute.data.experiences import Experience
from hf_clroute.heads import task_mask_logits
from hf_clroute.runtime.progress import progress_bar


@dataclass
class EvalTimer:
    """Samples and seconds spent in evaluation: the inference throughput."""

    samples: int = 0
    seconds: float = 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def sequence_nll(model: CLModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL and token count per sequence (exact corpus perplexity)."""
    logits = model(**model_inputs(batch)).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2).float(), labels, ignore_index=-100, reduction="none")
    return nll.sum(dim=1), (labels != -100).sum(dim=1)


@torch.no_grad()
def evaluate_experience(
    model: CLModel,
    loader: DataLoader,
    accelerator: Accelerator,
    *,
    task_classes: list[int] | None = None,
    timer: EvalTimer | None = None,
    progress: bool = False,
    desc: str = "eval",
    features: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    precision: Choice | str | None = None,
) -> float:
    """Accuracy (fraction) on a classification test split, or perplexity for a causal LM.

    ``progress`` shows a bar over the split's batches on the main process, on a terminal only (left off
    the screen when done).
    ``features``, a list, receives every batch's (classifier features as float32 on the CPU, labels),
    this process's batches in order: what a probe on the same split would compute again.
    ``precision``: the ``eval`` phase's :class:`~hf_clroute.backbones.precision.Choice`, or a setting to resolve
    for this model and the loader's batch size (None: ``$HF_CLROUTE_PRECISION``, else ``auto``).
    """
    choice = phase_choice(model, "eval", precision, loader, accelerator.device)
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    total, score, samples = 0.0, 0.0, 0
    try:
        batches = len(loader)
    except TypeError:  # an iterable loader: no total to show
        batches = None
    show = progress and accelerator.is_main_process
    for batch in progress_bar(loader, progress=show, total=batches, desc=desc, leave=False):
        if model.spec.modality == "lm":
            with choice.autocast():
                nll, tokens = accelerator.gather_for_metrics(sequence_nll(model, batch))
            score, total = score + nll.sum().item(), total + tokens.sum().item()
            samples += tokens.numel()
            continue
        with choice.autocast():
            out = model(**model_inputs(batch))
        logits = out.logits
        if features is not None and out.features is not None:
            features.append((out.features.float().cpu(), batch["labels"].cpu()))
        unlearnt = max(task_classes or [0]) >= logits.shape[1]
        if logits.shape[1] == 0 or unlearnt:  # the head has no output for this task yet: all wrong
            preds = torch.full_like(batch["labels"], -1)
        else:
            preds = task_mask_logits(logits, task_classes).argmax(dim=-1)
        preds, labels = accelerator.gather_for_metrics((preds, batch["labels"]))
        score += (preds == labels).sum().item()
        total += labels.numel()
        samples += labels.numel()
    if timer is not None:
        timer.samples += samples
        timer.seconds += time.perf_counter() - start
    model.train(was_training)
    if model.spec.modality == "lm":
        return math.exp(score / max(total, 1.0))
    return score / max(total, 1.0)


@torch.no_grad()
def feature_batches(model: CLModel, loader: Any,
                    precision: Choice | str | None = None) -> list[dict[str, torch.Tensor]]:
    """``loader``'s batches with their inputs replaced by the model's pooled backbone features
    (``model.extract_features``, in eval mode, under the ``features`` phase's autocast, kept as float32):
    for a model that :meth:`~CLModel.reads_frozen_features`, scoring these gives the scores of the
    inputs, without the backbone's forward pass."""
    choice = phase_choice(model, "features", precision, loader)
    was_training = model.training
    model.eval()
    try:
        batches = []
        for batch in loader:
            with choice.autocast():
                x = model.extract_features(model_inputs(batch))
            batches.append({"features": x.float(), "labels": batch["labels"]})
        return batches
    finally:
        model.train(was_training)


def phase_choice(model: CLModel, phase: str, precision: Choice | str | None, loader: Any,
                 device: torch.device | None = None) -> Choice:
    """``precision`` if it is a :class:`Choice` already, else resolved for ``model`` at ``loader``'s batch size."""
    if isinstance(precision, Choice):
        return precision
    batch_size = getattr(loader, "total_batch_size", None) or getattr(loader, "batch_size", None) or 0
    return resolve_for(model, phase, batch_size, precision, device)


class EvalCache:
    """The budget for keeping collated test batches between evaluations.

    A split of at most ``max_examples`` examples keeps its batches while all kept
    batches together fit in ``max_mb``; later batches are read again each time.
    """

    def __init__(self, max_examples: int = 20_000, max_mb: float = 1024.0) -> None:
        self.max_examples, self.max_bytes, self.bytes = max_examples, max_mb * 2**20, 0

    def admits(self, dataset: Any) -> bool:
        try:
            return 0 < len(dataset) <= self.max_examples and self.max_bytes > 0
        except TypeError:  # an iterable split: nothing to key batches by
            return False

    def take(self, nbytes: int) -> bool:
        if self.bytes + nbytes > self.max_bytes:
            return False
        self.bytes += nbytes
        return True


class CollatedOnce(torch.utils.data.Dataset):
    """A test split that collates each batch once: the DataLoader fetches batches by their
    indices (``__getitems__``), and a batch asked for again is the one collated before.

    The sampler, sharding over processes and device placement stay the DataLoader's and
    Accelerate's, so ``gather_for_metrics`` sees the same batches as without the cache.
    """

    def __init__(self, dataset: Any, collator: Callable, cache: EvalCache) -> None:
        self.dataset, self.collator, self.cache = dataset, collator, cache
        self.batches: dict[tuple[int, ...], dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        key = tuple(int(i) for i in indices)
        batch = self.batches.get(key)
        if batch is None:
            if hasattr(self.dataset, "__getitems__"):
                examples = self.dataset.__getitems__(list(key))
            else:
                examples = [self.dataset[i] for i in key]
            batch = self.collator(examples)
            if self.cache.take(batch_bytes(batch)):
                self.batches[key] = batch
        return dict(batch)


def batch_bytes(batch: Any) -> int:
    """Bytes held by the tensors of a batch (nested dicts, lists, tuples)."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v) for v in batch)
    return 64


def _collated(batch: Any) -> Any:
    """The DataLoader's collate_fn over :class:`CollatedOnce`: its batches come collated."""
    return batch


def test_loader(experience: Experience, collator, batch_size: int, accelerator: Accelerator,
                cache: EvalCache | None = None, **loader_options: Any) -> DataLoader:
    """The prepared loader over ``experience.test``; with ``cache``, a split the cache admits
    is collated once (read in this process: a worker's copy of the cache would be lost),
    and ``loader_options`` (``num_workers``...) apply to the splits it does not admit."""
    if cache is not None and cache.admits(experience.test):
        dataset = CollatedOnce(experience.test, collator, cache)
        pin = loader_options.get("pin_memory", False)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=_collated, pin_memory=pin)
    else:
        loader = DataLoader(experience.test, batch_size=batch_size, shuffle=False, collate_fn=collator,
                            **loader_options)
    return accelerator.prepare_data_loader(loader)
