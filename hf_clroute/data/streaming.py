"""Class-incremental tasks over a ``datasets`` stream that is never loaded into memory.

:func:`class_incremental_streaming` builds the tasks of :func:`~.streams.class_incremental`
from a source opened with ``streaming=True`` (a directory of parquet shards here, a Hub
dataset id online): the class-to-task map comes from the label feature (``ClassLabel``),
and each task's train and test splits are the source's splits filtered by label, read
shard by shard at training time. Nothing is counted, indexed or materialised up front, so
memory stays flat however long the stream is; the trainer deals each process its part of every
global batch (:func:`batch_parts`) with ``datasets.distributed.split_dataset_by_node``
(:mod:`hf_clroute.engine.batches`, ``examples`` strategy). Each process reads every row of the
stream's arrow data, undecoded, and decodes and collates only its own parts: the same global
batches as one process, at the cost of every node reading the whole stream.

What differs from the in-memory builder, because a stream cannot be indexed:

* a task's training order is the source's order (its shards in name order), optionally
  shuffled through a buffer of ``shuffle_buffer`` rows (seeded by ``seed`` and the task);
  ``class_incremental`` instead draws a permutation of the whole task;
* there is no per-class subsampling and no validation split;
* a class with no rows in a split is not detected before training (that would read the
  whole stream); its task simply has fewer classes to score.

The same builder takes an in-memory ``DatasetDict`` (the same files loaded without
``streaming``): the same tasks, rows and order, so the same accuracy matrix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import (
    ClassLabel,
    Dataset,
    DatasetDict,
    IterableDataset,
    IterableDatasetDict,
    load_dataset,
)

from hf_clroute.data.experiences import _CLASS_ORDER, _STREAM_ORDER, Experience, _rng

__all__ = ["batch_parts", "class_incremental_streaming", "parquet_stream", "streaming_suite_stream"]

SPLITS = ("train", "test")
#: rows per arrow batch when a task's rows are selected and relabelled
_ARROW_ROWS = 256


def batch_parts(rows: int, batch_size: int, num_processes: int) -> list[list[int]]:
    """Row indices of each process's part of one global batch of ``rows`` rows (``batch_size`` unless it
    is a stream's short last batch), in consecutive parts.

    When the processes divide the rows evenly (every whole batch, since ``batch_size`` is a multiple of
    ``num_processes``, and a short last batch of a multiple of them), each row goes to exactly one
    process and every part has the same size: the mean of the processes' mean losses, which DDP's
    gradient averaging takes, is one process's mean loss over the batch, and statistics and buffers see
    each row once. Otherwise the short batch is completed to ``batch_size`` by repeating its own rows,
    so every process takes the step; its repeated rows then count twice (in the gradient, class
    statistics and replay buffers), and only there N processes differ from one.
    """
    if batch_size % num_processes:
        raise ValueError(f"TrainingConfig.batch_size={batch_size} is the global batch and must divide evenly "
                         f"among the {num_processes} processes")
    if not 0 < rows <= batch_size:
        raise ValueError(f"a global batch holds 1 to batch_size={batch_size} rows, got {rows}")
    order = np.arange(rows) if rows % num_processes == 0 else np.resize(np.arange(rows), batch_size)
    part = len(order) // num_processes
    return [order[k * part:(k + 1) * part].tolist() for k in range(num_processes)]


def parquet_stream(directory: str | Path, streaming: bool = True) -> IterableDatasetDict | DatasetDict:
    """The ``train`` and ``test`` splits of a directory of parquet shards (``train-*.parquet``,
    ``test-*.parquet``, the Hub's layout), streamed (default) or loaded into memory.

    Shards are read in name order; their ``datasets`` feature metadata (a ``ClassLabel``
    label) is kept when they were written by ``Dataset.to_parquet``.
    """
    directory = Path(directory)
    files = {split: sorted(str(p) for p in directory.glob(f"{split}-*.parquet")) for split in SPLITS}
    missing = [split for split, found in files.items() if not found]
    if missing:
        raise FileNotFoundError(f"{directory}: no {' or '.join(f'{s}-*.parquet' for s in missing)} shards")
    if streaming:
        return load_dataset("parquet", data_files=files, streaming=True)
    return load_dataset("parquet", data_files=files, keep_in_memory=True)


def _label_names(dsets: Mapping[str, Any], dname: str, label_column: str,
                 class_names: Sequence[str] | None) -> list[str]:
    """The class names, by label id: ``class_names`` if given, else the label's ``ClassLabel``."""
    feature = (dsets["train"].features or {}).get(label_column)
    if feature is None and label_column not in (dsets["train"].column_names or []):
        raise ValueError(f"dataset {dname!r}, split 'train': no column {label_column!r}; "
                         f"columns are {dsets['train'].column_names}")
    if class_names is not None:
        names = [str(n) for n in class_names]
        if isinstance(feature, ClassLabel) and feature.num_classes != len(names):
            raise ValueError(f"dataset {dname!r}, column {label_column!r}: class_names has {len(names)} names "
                             f"but the ClassLabel has {feature.num_classes} classes")
        return names
    if not isinstance(feature, ClassLabel):
        raise ValueError(
            f"dataset {dname!r}, split 'train', column {label_column!r}: a stream's classes come from a ClassLabel "
            f"feature (its names), but the column is {feature!r}; a stream cannot be scanned for its labels "
            "before training. Pass class_names=[...] (one name per label id), or cast the column to ClassLabel")
    return list(feature.names)


def class_incremental_streaming(
    source: IterableDatasetDict | DatasetDict | str | Path,
    *,
    n_tasks: int,
    seed: int = 0,
    class_order: Sequence[int] | None = None,
    class_names: Sequence[str] | None = None,
    label_column: str = "label",
    shuffle_buffer: int = 0,
    name: str | None = None,
) -> list[Experience]:
    """Class-incremental tasks over a streamed ``train``/``test`` source (or a parquet directory).

    The classes (all ids of the label's ``ClassLabel``, or of ``class_names``) are shuffled by
    ``seed`` as :func:`~.streams.class_incremental` shuffles them, unless ``class_order`` is
    given, and cut into ``n_tasks`` tasks of equal size. Each task's splits are the source's
    splits filtered to its classes, with ``label`` the incremental id (a ``ClassLabel`` of the
    names in class order) and ``original_label`` the source's label: the columns of
    ``class_incremental``. ``shuffle_buffer`` > 0 shuffles each task's training rows through a
    buffer of that many rows; 0 keeps the source order.

    Raises ``ValueError`` before anything is read when the label column is not a ``ClassLabel``
    and no ``class_names`` are given, or when the classes do not tile into ``n_tasks`` tasks.
    """
    if isinstance(source, (str, Path)):
        dname = name or Path(source).name
        source = parquet_stream(source)
    else:
        dname = name or "stream"
    missing = [s for s in SPLITS if s not in source]
    if missing:
        raise ValueError(f"dataset {dname!r}: no split {missing[0]!r}; a stream needs 'train' and 'test'")
    names = _label_names(source, dname, label_column, class_names)
    if class_order is not None:
        order = [int(c) for c in class_order]
        stray = [c for c in order if not 0 <= c < len(names)]
        if stray or len(set(order)) != len(order):
            raise ValueError(f"dataset {dname!r}: class_order must name distinct label ids in [0, {len(names)}), "
                             f"got {order}")
    else:
        order = [int(c) for c in _rng(seed, _CLASS_ORDER).permutation(len(names))]
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, int) or n_tasks < 1 or len(order) % n_tasks:
        raise ValueError(f"dataset {dname!r}: n_tasks={n_tasks!r} does not divide the {len(order)} classes into "
                         "tasks of equal size")
    k = len(order) // n_tasks
    lookup = np.full(len(names), -1, dtype=np.int64)
    lookup[order] = np.arange(len(order))
    ordered_names = [names[c] for c in order]
    experiences = []
    for t in range(n_tasks):
        task = order[t * k:(t + 1) * k]
        splits = {split: _task_split(source[split], task, lookup, ordered_names, label_column) for split in SPLITS}
        if shuffle_buffer:
            splits["train"] = splits["train"].shuffle(seed=int(_rng(seed, _STREAM_ORDER, t).integers(2**31)),
                                                      buffer_size=shuffle_buffer)
        meta = {"original_classes": task, "class_names": ordered_names[t * k:(t + 1) * k]}
        experiences.append(Experience(t, f"{dname}/task{t}", list(range(t * k, (t + 1) * k)), splits["train"],
                                      splits["test"], meta))
    return experiences


def _task_split(split: IterableDataset | Dataset, task: list[int], lookup: np.ndarray, names: list[str],
                label_column: str) -> IterableDataset | Dataset:
    """``split``'s rows of the classes ``task``, relabelled to incremental ids, lazily for a stream.

    Both steps work on arrow record batches of ``_ARROW_ROWS`` rows: no image is decoded (and
    re-encoded) to select or relabel rows, and no more than a batch is held at once.
    """
    classes = pa.array(task, type=pa.int64())
    features = split.features.copy() if split.features is not None else None
    table = split.with_format("arrow")
    kept = table.filter(lambda t: pc.is_in(t[label_column].cast(pa.int64()), value_set=classes),
                        batched=True, batch_size=_ARROW_ROWS, **_in_memory(split))

    def relabel(t: pa.Table) -> pa.Table:
        labels = t[label_column].cast(pa.int64()).to_numpy()
        t = t.drop_columns([label_column])
        return t.append_column("original_label", pa.array(labels)).append_column("label", pa.array(lookup[labels]))

    if features is not None:
        features["original_label"] = features.pop(label_column)
        features["label"] = ClassLabel(names=names)
    out = kept.map(relabel, batched=True, batch_size=_ARROW_ROWS, features=features, **_in_memory(split))
    return out.with_format(None)


def _in_memory(split: Any) -> dict[str, Any]:
    return {} if isinstance(split, IterableDataset) else {"keep_in_memory": True}


#: suite fields a streamed suite cannot honour (a stream is not indexed), with their "off" values
_UNSTREAMABLE = {"train_per_class": None, "test_per_class": None, "validation_per_class": 0,
                 "min_examples_per_class": 0, "max_classes": 0}


def streaming_suite_stream(suite: Any, seed: int) -> list[Experience]:
    """The tasks of a suite with ``streaming: true`` (``hf_clroute.bench.harness.suites.SuiteConfig``): its
    ``dataset`` directory streamed, cut into ``n_tasks`` class-incremental tasks by ``seed``."""
    if suite.scenario != "class":
        raise ValueError(
            f"suite {suite.name!r}: streaming suites are class-incremental, got scenario={suite.scenario!r}")
    for option, off in _UNSTREAMABLE.items():
        if getattr(suite, option) != off:
            raise ValueError(f"suite {suite.name!r}: {option}={getattr(suite, option)!r} needs the dataset indexed in "
                             f"memory; a streaming suite reads every row "
                             f"(set {option} to {off!r} or streaming to false)")
    stream = class_incremental_streaming(suite.dataset, n_tasks=suite.n_tasks, seed=seed,
                                         label_column=suite.label_column, name=suite.name)
    for experience in stream:  # what an adapter's training history calls this stream
        experience.info["stream"] = f"{suite.name} (seed {seed})"
    return stream
