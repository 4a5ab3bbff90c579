"""One task of a continual-learning stream (:class:`Experience`) and the seeded draws every stream builder shares.

The builders live beside it: :mod:`hf_clroute.data.class_tasks` (``class_incremental``) and
:mod:`hf_clroute.data.domain_tasks` (``domain_incremental``, ``permuted``, ``text_domains``); all are
importable from :mod:`hf_clroute.data`.  Every builder is deterministic given its ``seed`` (stream
order fixed per seed): class order, per-class subsampling, task permutations and each task's
training order are drawn from independent numpy generators seeded with ``(seed, purpose)``, so
changing e.g. the subsample size does not change the class order.  Work is done on index arrays
read from arrow (``Dataset.select``), never by looping over images in Python, except where pixels
must change (``permuted``).

Validation split
----------------
``class_incremental(..., validation_per_class=n)`` removes ``n`` training
examples per class (drawn by the seed from an independent generator) and
gives each :class:`Experience` a ``validation`` dataset with the columns and
incremental labels of ``test``.  :func:`validation_stream` returns the
experiences with ``test`` replaced by ``validation``, so a tuner can score
through the normal evaluation path without reading test data.  With
``validation_per_class=0`` (the default) nothing is drawn and the stream is
the one built without the option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from datasets import Dataset, DatasetDict, IterableDataset

from hf_clroute.data.labeled import column_array

__all__ = ["Experience", "validation_stream"]

# Purposes for independent per-seed random streams.
_CLASS_ORDER, _SUBSAMPLE, _STREAM_ORDER, _PERMUTATION, _VALIDATION = range(5)


def _rng(seed: int, purpose: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([seed, purpose, *extra])


@dataclass
class Experience:
    """One task of a stream.

    ``train`` is already in the task's fixed stream order; ``classes`` holds
    the (incremental) class ids this task introduces for class-IL, all class
    ids for domain-IL, and is empty for language-model domains.
    ``validation`` (optional) is held-out training data of the same classes,
    disjoint from ``train`` and ``test``.

    Construction checks that ``train``, ``test`` and ``validation`` (when
    given) have rows and, when ``classes`` is non-empty, that every ``label``
    is one of ``classes``; a ``ValueError`` names the dataset, the split, the
    column, the task and the offending value.
    """

    task_id: int
    name: str
    classes: list[int]
    train: Dataset
    test: Dataset
    info: dict = field(default_factory=dict)
    validation: Dataset | None = None

    def __post_init__(self) -> None:
        for split, ds in self.splits().items():
            self._check_split(split, ds)

    def splits(self) -> dict[str, Dataset]:
        """``train``, ``test`` and, when present, ``validation``."""
        out = {"train": self.train, "test": self.test}
        if self.validation is not None:
            out["validation"] = self.validation
        return out

    def _where(self, split: str, column: str) -> str:
        dataset = self.name.rsplit("/", 1)[0] if "/" in self.name else self.name
        return f"dataset {dataset!r}, split {split!r}, column {column!r}, task {self.task_id} ({self.name!r})"

    def _check_split(self, split: str, ds: Dataset) -> None:
        try:
            rows = len(ds)
        except TypeError:  # an IterableDataset: nothing to count without reading it
            return
        columns = list(getattr(ds, "column_names", None) or [])
        column = "label" if "label" in columns or not columns else columns[0]
        if rows == 0:
            raise ValueError(f"{self._where(split, column)}: the split is empty (0 rows); "
                             f"every task needs {split} examples")
        if not self.classes or "label" not in columns:
            return
        labels = column_array(ds)
        outside = ~np.isin(labels, np.asarray(self.classes))
        if outside.any():
            values, counts = np.unique(labels[outside], return_counts=True)
            found = _value_counts(values, counts)
            raise ValueError(f"{self._where(split, 'label')}: label {found} is not one of the task's "
                             f"classes {list(self.classes)}")

    def train_stream(self, epochs: int = 1) -> IterableDataset:
        """The training data read in stream order, once per epoch (online learning: ``epochs=1``).

        Later epochs repeat the same fixed order: the stream order is part of
        the benchmark (fixed per seed), and a replay of it keeps runs
        comparable across methods.  One shard keeps the order exact.
        """
        if epochs < 1:
            raise ValueError(f"experience {self.name!r}: epochs must be >= 1, got {epochs}")
        # A streamed task (data.streaming) is read as it comes, shard after shard.
        stream = self.train if isinstance(self.train, IterableDataset) else self.train.to_iterable_dataset(num_shards=1)
        return stream.repeat(epochs) if epochs > 1 else stream

    def __repr__(self) -> str:
        def size(split: Any) -> Any:  # a stream has no length until read
            return "stream" if isinstance(split, IterableDataset) else len(split)

        validation = "" if self.validation is None else f", validation={size(self.validation)}"
        return (f"Experience(task_id={self.task_id}, name={self.name!r}, classes={self.classes}, "
                f"train={size(self.train)}, test={size(self.test)}{validation})")


def validation_stream(experiences: Sequence[Experience]) -> list[Experience]:
    """The stream scored on its validation splits: each experience with ``test`` = its ``validation``.

    Training data, classes, task order and labels are unchanged, so evaluation
    code that reads ``experience.test`` scores on validation data and never
    touches the test split.  ``info["evaluation_split"]`` is ``"validation"``.
    Raises ``ValueError`` when an experience has no validation split (build
    the stream with ``class_incremental(..., validation_per_class=n)``).
    """
    out = []
    for e in experiences:
        if e.validation is None:
            raise ValueError(f"experience {e.name!r} (task {e.task_id}) has no validation split; build the "
                             "stream with class_incremental(..., validation_per_class=n) with n > 0")
        out.append(dataclasses.replace(e, test=e.validation, validation=None,
                                       info={**e.info, "evaluation_split": "validation"}))
    return out


# --------------------------------------------------------------------------- shared by the builders


def _dataset_name(dsets: DatasetDict, name: str | None) -> str:
    return name or dsets["train"].info.dataset_name or "dataset"


def _value_counts(values: np.ndarray, counts: np.ndarray) -> str:
    """``5 (1 row), 7 (3 rows)``."""
    return ", ".join(f"{int(v)} ({int(n)} row{'' if n == 1 else 's'})" for v, n in zip(values, counts, strict=True))


def _split_labels(dsets: DatasetDict) -> dict[str, np.ndarray]:
    return {split: column_array(dsets[split]) for split in ("train", "test")}


def _subsample(idx: np.ndarray, n: int | None, rng: np.random.Generator) -> np.ndarray:
    return idx if n is None or n >= len(idx) else np.sort(rng.choice(idx, n, replace=False))


def _ordered(ds: Dataset, idx: np.ndarray, rng: np.random.Generator | None) -> Dataset:
    """Select ``idx`` rows, in a seeded stream order when ``rng`` is given."""
    return ds.select(rng.permutation(idx) if rng is not None else idx)
