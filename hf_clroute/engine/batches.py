"""How the trainer reads a task's training stream: whole batches, in stream order, ready on the device.

A ``datasets`` stream is read in arrow chunks and cut into batches of ``batch_size`` rows
(:class:`OrderedStream`), dealt to ``num_workers`` DataLoader workers by whole batches, so the
batches and their order never depend on the number of workers.

With one process, a collator that takes columns (``takes_columns = True``: the collators of
:mod:`hf_clroute.data.collate`) gets each batch as the chunk's column slices, which it converts
in one step, with no per-row dicts; the batches go to the device here, as Accelerate's loader
would move them.

With several processes (on one machine or several), each process reads its own share of the
stream (:func:`process_share`, through ``datasets.distributed.split_dataset_by_node``): every
global batch is cut into one consecutive part per process, the slice Accelerate's
``split_batches`` would deal it, so 1 and N processes train on the same global batches. Only a
process's own parts are decoded and collated there; nothing goes through a dispatcher.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import datasets
import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader, get_worker_info

from hf_clroute.data.streaming import batch_parts

Columns = dict[str, Any]


def seed_worker(worker_id: int) -> None:
    """Seed a DataLoader worker's numpy and ``random`` from its torch seed.

    The loader draws the workers' torch seeds from the run's torch generator (seeded by
    ``TrainingConfig.seed`` at ``fit()``), so a collator that draws random numbers in a
    worker draws the same ones in every run with that seed and that many workers.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class OrderedStream(torch.utils.data.IterableDataset):
    """A ``datasets`` training stream read in chunks and dealt to DataLoader workers by whole batches.

    Worker k of W yields the batches k, k + W, k + 2W, ... and the DataLoader takes one
    batch from each worker in turn, so the batches and their order are those of a loader
    without workers, for any W. (A ``datasets`` IterableDataset handed to workers directly is
    split by shards, and a training stream has one shard: one worker would read it all.)
    Every worker reads all arrow rows but decodes (images) only its own batches.

    ``columns=True`` yields each batch as a dict of column slices (for a DataLoader with
    ``batch_size=None`` and a collator that takes columns); else its rows, one dict each
    (for a DataLoader with ``batch_size``). Chunked reads cost less per example than reading
    row by row. A chunk holds whole batches, at most ``chunk_size`` rows and, for fixed-size
    array columns, about ``chunk_bytes``: 256 decoded 224x224 RGB images are a 38 MB read, and
    allocations that large are mapped and faulted in afresh each time (slower, erratic reads).
    """

    def __init__(self, data: datasets.IterableDataset, batch_size: int, chunk_size: int = 256,
                 chunk_bytes: int = 4 * 2**20, columns: bool = False) -> None:
        self.data, self.batch_size, self.columns = data, batch_size, columns
        row = fixed_row_bytes(data.features)
        rows = min(chunk_size, chunk_bytes // row) if row else chunk_size
        self.chunk_size = max(1, rows // batch_size) * batch_size

    def __iter__(self) -> Iterator[Columns]:
        info = get_worker_info()
        workers, rank = (info.num_workers, info.id) if info is not None else (1, 0)
        source, features = self.data, self.data.features
        decode = workers > 1 and features is not None and any(
            datasets.features.features.require_decoding(f) for f in features.values())
        if decode:  # each worker decodes its own batches only
            source = self.data.decode(False)
        for index, batch in enumerate(self._batches(source)):
            if index % workers != rank:
                continue
            if decode:
                batch = features.decode_batch(batch)
            if self.columns:
                yield batch
            else:
                names = list(batch)
                yield from (dict(zip(names, row)) for row in zip(*(batch[name] for name in names)))

    def _batches(self, source: datasets.IterableDataset) -> Iterator[Columns]:
        """``batch_size`` rows at a time (the last batch may be short), as column slices."""
        size, rest = self.batch_size, None
        for chunk in source.iter(batch_size=self.chunk_size):
            if rest is not None:  # a chunk that did not end on a batch boundary
                chunk = {name: _concat(rest[name], values) for name, values in chunk.items()}
            rows = len(next(iter(chunk.values())))
            whole = rows - rows % size
            for start in range(0, whole, size):
                yield {name: values[start:start + size] for name, values in chunk.items()}
            rest = {name: values[whole:] for name, values in chunk.items()} if whole < rows else None
        if rest is not None:
            yield rest


def _concat(first: Any, second: Any) -> Any:
    if isinstance(first, np.ndarray):
        return np.concatenate([first, second])
    return list(first) + list(second)


def fixed_row_bytes(features: datasets.Features | None) -> int:
    """Bytes per row of the fixed-size array columns (``Array2D``...``Array5D``), 0 when there are none."""
    total = 0
    for feature in (features or {}).values():
        shape = getattr(feature, "shape", None)
        if isinstance(shape, tuple) and hasattr(feature, "dtype"):
            total += int(np.prod(shape)) * np.dtype(feature.dtype).itemsize
    return total


def process_share(data: datasets.IterableDataset, batch_size: int, process_index: int,
                  num_processes: int) -> datasets.IterableDataset:
    """Process ``process_index``'s part of every global batch of a training stream, one part a row.

    Each global batch of ``batch_size`` rows is cut into ``num_processes`` consecutive parts
    (:func:`~hf_clroute.data.streaming.batch_parts`); ``split_dataset_by_node`` (``examples``
    strategy: part k of each batch to process k, whatever the shard count) gives this process its
    part. A short last batch is cut into equal parts when the processes divide its rows (each row
    used once, the step one process takes); otherwise it is completed by repeating its own rows, so
    every process takes the same number of steps. Every process reads the stream's undecoded rows;
    :class:`ShareReader` decodes only this process's parts.
    """
    if batch_size % num_processes:
        raise ValueError(f"TrainingConfig.batch_size={batch_size} is the global batch and must divide evenly "
                         f"among the {num_processes} processes")

    def deal(batch: Columns) -> Columns:
        parts = batch_parts(len(next(iter(batch.values()))), batch_size, num_processes)
        return {name: [[values[i] for i in part] for part in parts] for name, values in batch.items()}

    parts = data.decode(False).map(deal, batched=True, batch_size=batch_size)
    return split_dataset_by_node(parts, rank=process_index, world_size=num_processes, strategy="examples")


class ShareReader(torch.utils.data.IterableDataset):
    """A :func:`process_share` stream as batches: each part decoded (images) and given as column
    slices (``columns=True``) or as row dicts; parts are dealt to DataLoader workers in turn."""

    def __init__(self, share: datasets.IterableDataset, features: datasets.Features | None,
                 columns: bool) -> None:
        self.share, self.features, self.columns = share, features, columns

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, rank = (info.num_workers, info.id) if info is not None else (1, 0)
        # ``iter`` rather than ``for``: a datasets stream iterated in a worker would split by shards.
        for index, chunk in enumerate(self.share.iter(batch_size=1)):
            if index % workers != rank:
                continue
            batch = {name: values[0] for name, values in chunk.items()}
            if self.features is not None:
                batch = self.features.decode_batch(batch)
            if self.columns:
                yield batch
            else:
                names = list(batch)
                yield [dict(zip(names, row)) for row in zip(*(batch[name] for name in names))]


class DeviceBatches:
    """A DataLoader's batches moved to ``device`` (nothing to move on the CPU)."""

    def __init__(self, loader: DataLoader, device: torch.device, non_blocking: bool = False) -> None:
        self.loader, self.device, self.non_blocking = loader, device, non_blocking

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.device.type == "cpu":
            yield from self.loader
            return
        for batch in self.loader:
            yield send_to_device(batch, self.device, non_blocking=self.non_blocking)


def training_loader(data: Any, collator: Callable, config: Any,  # config: the TrainingConfig
                    accelerator: Accelerator) -> Iterable[dict[str, Any]]:
    """The batches the trainer trains a task on, on the device: ``batch_size`` examples a batch,
    in stream order, with the config's workers, prefetch and pinning.

    One process: a plain DataLoader (column slices for a collator that takes them), moved to the
    device here. Several: each process reads its part of every global batch (:func:`process_share`);
    a map-style dataset (no stream) still goes through the loader Accelerate prepares.
    """
    options = config.loader_options(accelerator.device)
    iterable = isinstance(data, datasets.IterableDataset)
    columns = getattr(collator, "takes_columns", False)
    if accelerator.num_processes > 1 and iterable:
        share = process_share(data, config.batch_size, accelerator.process_index, accelerator.num_processes)
        loader = DataLoader(ShareReader(share, data.features, columns), batch_size=None, collate_fn=collator, **options)
        return DeviceBatches(loader, accelerator.device, non_blocking=options["pin_memory"])
    if accelerator.num_processes == 1 and iterable and columns:
        loader = DataLoader(OrderedStream(data, config.batch_size, columns=True), batch_size=None,
                            collate_fn=collator, **options)
        return DeviceBatches(loader, accelerator.device, non_blocking=options["pin_memory"])
    reader = OrderedStream(data, config.batch_size) if iterable else data
    loader = DataLoader(reader, batch_size=config.batch_size, collate_fn=collator, **options)
    if accelerator.num_processes == 1:
        return DeviceBatches(loader, accelerator.device, non_blocking=options["pin_memory"])
    return accelerator.prepare_data_loader(loader)
