"""Class-incremental streams: :func:`class_incremental` and the checks that name what is wrong.

Columns of its experiences' datasets: the input column (``image`` or ``text``), ``label`` (the
*incremental* id: the class's position in the class order, a ``ClassLabel`` whose names are the
original class names in that order) and ``original_label`` (the dataset's own label).  Determinism
and the validation split: see :mod:`hf_clroute.data.experiences`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Value

from hf_clroute.data.experiences import (
    _CLASS_ORDER,
    _STREAM_ORDER,
    _SUBSAMPLE,
    _VALIDATION,
    Experience,
    _dataset_name,
    _ordered,
    _rng,
    _split_labels,
    _value_counts,
)
from hf_clroute.data.labeled import column_array

__all__ = ["class_incremental", "classes_with_at_least"]

# Key of the seed-independent test subsample (a large constant, so it never equals a run seed's key).
_FIXED_TEST = 2**31 - 1


def _class_name(dsets: DatasetDict, label: int) -> str:
    """``3 ('Dress')``: the label and its ClassLabel name (just ``3`` when the name is ``'3'``)."""
    feature = dsets["train"].features.get("label")
    if isinstance(feature, ClassLabel) and 0 <= label < feature.num_classes and feature.int2str(label) != str(label):
        return f"{label} ({feature.int2str(label)!r})"
    return str(label)



def classes_with_at_least(dsets: DatasetDict, n: int, split: str | None = None) -> list[int]:
    """Class ids with at least ``n`` examples, counted in ``split`` or in train and test together.

    E.g. the 40 WordNet categories with >= 300 definitions:
    ``classes_with_at_least(load_source("wordnet"), 300)``.
    """
    splits = [split] if split else ["train", "test"]
    labels = np.concatenate([column_array(dsets[s]) for s in splits])
    values, counts = np.unique(labels, return_counts=True)
    return [int(v) for v, c in zip(values, counts, strict=True) if c >= n]


def _subsample_per_class(labels: np.ndarray, idx: np.ndarray, per_class: int | None,
                         rng: np.random.Generator | None) -> np.ndarray:
    """At most ``per_class`` indices of each class in ``idx`` (all of a smaller class), sorted.

    ``rng`` None draws each class with a generator keyed on its label alone (not the seed),
    so the same examples are kept whatever the seed and class order (a fixed test set)."""
    if per_class is None:
        return idx
    keep = []
    for cls in np.unique(labels[idx]):
        members = idx[labels[idx] == cls]
        draw = rng if rng is not None else np.random.default_rng([_FIXED_TEST, int(cls)])
        keep.append(draw.permutation(members)[:per_class])
    return np.sort(np.concatenate(keep)) if keep else idx




def _where(dname: str, split: str | Sequence[str], column: str = "label", task: int | None = None,
           task_classes: str = "") -> str:
    """The message prefix naming where a problem is: dataset, split(s), column and task."""
    if isinstance(split, str):
        splits = f"split {split!r}"
    else:
        splits = "splits " + " and ".join(repr(s) for s in split)
    task_part = "" if task is None else f", task {task}" + (f" (classes {task_classes})" if task_classes else "")
    return f"dataset {dname!r}, {splits}, column {column!r}{task_part}"


def _label_ranges(values: Sequence[int]) -> str:
    """Sorted labels as compact ranges: ``[0, 1, 2, 3, 7]`` -> ``"0-3, 7"``."""
    values = sorted(int(v) for v in values)
    parts: list[str] = []
    start = prev = None
    for v in [*values, None]:
        if v is not None and prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    return ", ".join(parts)


def _check_labelled_splits(dsets: DatasetDict, dname: str) -> dict[str, np.ndarray]:
    """Both splits present, non-empty, with integer labels inside the ``ClassLabel`` range.

    Returns the label arrays.  Negative labels mean "unlabelled" in HF datasets
    (e.g. GLUE test splits) and are allowed here; they never become a class.
    """
    for split in ("train", "test"):
        if split not in dsets:
            raise ValueError(f"dataset {dname!r}: no split {split!r}; available splits: {list(dsets)}")
        ds = dsets[split]
        if "label" not in ds.column_names:
            raise ValueError(f"{_where(dname, split)}: no such column; available columns: {ds.column_names}")
        if len(ds) == 0:
            raise ValueError(f"{_where(dname, split)}: the split is empty (0 rows); every task needs "
                             f"{split} examples")
        feature = ds.features["label"]
        if not (isinstance(feature, ClassLabel)
                or (isinstance(feature, Value) and feature.dtype.startswith(("int", "uint")))):
            raise ValueError(f"{_where(dname, split)}: labels have type {feature}, not integers; encode them "
                             "first (e.g. Dataset.class_encode_column)")
    labels = _split_labels(dsets)
    for split, arr in labels.items():
        feature = dsets[split].features["label"]
        if not isinstance(feature, ClassLabel):
            continue
        bad = arr >= feature.num_classes
        if bad.any():
            values, counts = np.unique(arr[bad], return_counts=True)
            found = _value_counts(values, counts)
            raise ValueError(f"{_where(dname, split)}: label {found} is outside the ClassLabel's "
                             f"{feature.num_classes} names (labels 0-{feature.num_classes - 1})")
    return labels


def _check_count(dname: str, option: str, value: int | None, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        allowed = f"an integer >= {minimum}" + (" or None (all)" if allow_none else "")
        raise ValueError(f"dataset {dname!r}: {option} must be {allowed}, got {value!r}")


def _resolve_class_order(dsets: DatasetDict, dname: str, present: set[int], classes: Sequence[int] | None,
                         class_order: Sequence[int] | None, seed: int, counts: np.ndarray | None = None,
                         min_examples_per_class: int = 0, max_classes: int = 0) -> list[int]:
    """The classes of the stream in order.

    ``class_order`` as given, else ``classes`` (or all present classes) sorted
    then shuffled by seed.  ``min_examples_per_class`` first drops classes with
    fewer examples (train and test counted together, ``counts``), then
    ``max_classes`` keeps the first that many (lowest labels, or the first of
    ``class_order``).
    """
    if class_order is not None:
        base = [int(c) for c in class_order]
        if len(set(base)) != len(base):
            raise ValueError(f"dataset {dname!r}: class_order repeats a class: {base}")
        if classes is not None and set(base) != {int(c) for c in classes}:
            raise ValueError(f"dataset {dname!r}: class_order and classes name different classes")
    else:
        base = sorted({int(c) for c in classes}) if classes is not None else sorted(present)
    absent = [c for c in base if c not in present]
    if absent:
        names = ", ".join(_class_name(dsets, c) for c in absent)
        raise ValueError(f"dataset {dname!r}: class {names} appears in no split (column 'label')")
    if min_examples_per_class:
        kept = [c for c in base if counts[c] >= min_examples_per_class]
        if not kept:
            raise ValueError(f"{_where(dname, ('train', 'test'))}: no class has at least "
                             f"min_examples_per_class={min_examples_per_class} examples (the most is "
                             f"{int(max(counts[c] for c in base))})")
        base = kept
    if max_classes:
        base = base[:max_classes]
    if class_order is not None:
        return base
    return [int(c) for c in _rng(seed, _CLASS_ORDER).permutation(base)]


def _tiles(n_classes: int, n_tasks: int | None, classes_per_task: int | None, dname: str) -> int | None:
    """Classes per task when the tasks tile the class order exactly, else None."""
    if n_tasks is None and classes_per_task is None:
        raise ValueError(f"dataset {dname!r}: give n_tasks or classes_per_task")
    if (n_tasks is not None and n_tasks < 1) or (classes_per_task is not None and classes_per_task < 1):
        raise ValueError(f"dataset {dname!r}: n_tasks and classes_per_task must be >= 1")
    k = classes_per_task or n_classes // n_tasks
    tasks = n_tasks or (n_classes // k if k else 0)
    return k if k and k * tasks == n_classes else None


def _stray_labels(order: Sequence[int], counts: Mapping[str, np.ndarray]) -> list[int]:
    """Labels that look like data errors: far rarer than the others, or outside their contiguous run."""
    totals = {c: int(counts["train"][c] + counts["test"][c]) for c in order}
    median = float(np.median(list(totals.values())))
    rare = {c for c, n in totals.items() if n <= max(1.0, 0.01 * median)}
    labels = sorted(order)
    run = 1
    while run < len(labels) and labels[run] == labels[run - 1] + 1:
        run += 1
    apart = set(labels[run:]) if len(labels) / 2 <= run < len(labels) else set()
    # A handful of odd labels is a diagnosis; many is just a sparse label set.
    stray = sorted(rare | apart)
    return stray if len(stray) <= max(1, len(order) // 4) else []


def _tiling_error(dsets: DatasetDict, dname: str, order: Sequence[int], counts: Mapping[str, np.ndarray],
                  n_tasks: int | None, classes_per_task: int | None) -> ValueError:
    """Why the classes do not tile into tasks, naming stray labels and the options that fix it."""
    n = len(order)
    stray = _stray_labels(order, counts)
    splits = [s for s in ("train", "test") if any(counts[s][c] for c in stray)] or ["train", "test"]
    where = _where(dname, splits[0] if len(splits) == 1 else splits)
    message = (f"{where}: {n} classes cannot be split into {n_tasks or '?'} tasks of "
               f"{classes_per_task or '?'} classes (the stream's labels: {_label_ranges(order)})")
    if stray:
        others = [c for c in order if c not in stray]
        median = int(np.median([counts["train"][c] + counts["test"][c] for c in others])) if others else 0
        found = "; ".join(f"{_class_name(dsets, c)}: {int(counts['train'][c])} train and "
                          f"{int(counts['test'][c])} test examples" for c in stray)
        message += (f". Label{'s' if len(stray) > 1 else ''} {', '.join(map(str, stray))} look"
                    f"{'' if len(stray) > 1 else 's'} stray ({found}; the other labels are "
                    f"{_label_ranges(others)} with a median of {median} examples each): remove those rows, or")
    else:
        message += ". Either"
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    message += (" choose the stream's classes with min_examples_per_class (keep classes with at least that "
                "many train+test examples) or max_classes (keep the N lowest labels), or set n_tasks to a "
                f"divisor of {n} ({', '.join(map(str, divisors))}); these options exist both as "
                "class_incremental arguments and as suite JSON fields")
    return ValueError(message)


def _carve_validation(labels: np.ndarray, idx: np.ndarray, per_class: int, rng: np.random.Generator,
                      dname: str, task: int, task_desc: str) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` indices of each class in ``idx`` for validation, and the rest; both sorted."""
    held, rest = [], []
    for cls in np.unique(labels[idx]):
        members = rng.permutation(idx[labels[idx] == cls])
        if len(members) <= per_class:
            raise ValueError(f"{_where(dname, 'train', 'label', task, task_desc)}: class {int(cls)} has "
                             f"{len(members)} train examples, so validation_per_class={per_class} "
                             "leaves none for training")
        held.append(members[:per_class])
        rest.append(members[per_class:])
    return np.sort(np.concatenate(held)), np.sort(np.concatenate(rest))


def _with_incremental_labels(ds: Dataset, labels: np.ndarray, lookup: np.ndarray,
                             names: list[str]) -> Dataset:
    """Replace ``label`` by its incremental id and keep the original in ``original_label``.

    Done once per split on the whole table (a horizontal arrow concat, no
    image copy); tasks then ``select`` their rows.  Classes outside the
    stream get -1 and are never selected.
    """
    ds = ds.rename_column("label", "original_label")
    return ds.add_column("label", lookup[labels].astype(np.int64), feature=ClassLabel(names=names))


def class_incremental(
    dsets: DatasetDict,
    *,
    n_tasks: int | None = None,
    classes_per_task: int | None = None,
    seed: int = 0,
    class_order: Sequence[int] | None = None,
    train_per_class: int | None = None,
    test_per_class: int | None = None,
    classes: Sequence[int] | None = None,
    name: str | None = None,
    min_examples_per_class: int = 0,
    max_classes: int = 0,
    validation_per_class: int = 0,
) -> list[Experience]:
    """Split a labelled ``DatasetDict`` (train/test, ``label``) into class-incremental tasks.

    The classes (all present ones, or ``classes``) are shuffled by ``seed``
    unless ``class_order`` is given, then cut into tasks of equal size; task t
    holds incremental ids ``[t*k, (t+1)*k)``.  Before shuffling,
    ``min_examples_per_class`` keeps only classes with at least that many
    examples (train and test counted together) and ``max_classes`` keeps the
    first that many (lowest labels, or the head of ``class_order``); 0 turns
    either off.  These two and ``n_tasks``, ``train_per_class``,
    ``test_per_class`` are also suite JSON fields.

    ``validation_per_class`` (an integer count, default 0) removes that many
    training examples of every class (chosen by ``seed``, independently of the
    other draws) into the experience's ``validation`` split, in dataset order,
    with the incremental labels of ``test``; ``train_per_class`` then
    subsamples the remaining training examples.  0 draws nothing: the stream
    is exactly the one built without the option.  ``train_per_class`` /
    ``test_per_class`` subsample each class (training: fixed per seed; test:
    the same examples for every seed and class order; smaller classes are
    kept whole).  Each task's training data is shuffled into a fixed
    stream order by ``seed``; test data keeps the dataset order.

    Raises ``ValueError`` naming the dataset, split, column, task and value
    for: a missing or empty split, non-integer labels, labels outside the
    ``ClassLabel`` range, classes that do not tile into tasks (stray labels
    are named), a class of a task without train or without test examples, and
    a class with too few training examples for ``validation_per_class``.
    """
    dname = _dataset_name(dsets, name)
    labels = _check_labelled_splits(dsets, dname)
    _check_count(dname, "train_per_class", train_per_class, 1, allow_none=True)
    _check_count(dname, "test_per_class", test_per_class, 1, allow_none=True)
    _check_count(dname, "validation_per_class", validation_per_class, 0)
    _check_count(dname, "min_examples_per_class", min_examples_per_class, 0)
    _check_count(dname, "max_classes", max_classes, 0)
    # Negative labels mean "unlabelled" in HF datasets (e.g. GLUE test splits): never a class.
    present = {int(c) for arr in labels.values() for c in np.unique(arr) if c >= 0}
    named = [int(c) for given in (classes, class_order) if given is not None for c in given]
    size = max(present | set(named), default=0) + 1
    counts = {s: np.bincount(arr[arr >= 0], minlength=size) for s, arr in labels.items()}
    order = _resolve_class_order(dsets, dname, present, classes, class_order, seed,
                                 counts["train"] + counts["test"], min_examples_per_class, max_classes)
    k = _tiles(len(order), n_tasks, classes_per_task, dname)
    if k is None:
        raise _tiling_error(dsets, dname, order, counts, n_tasks, classes_per_task)

    lookup = np.full(max(present | set(order)) + 1, -1, dtype=np.int64)
    lookup[order] = np.arange(len(order))
    feature = dsets["train"].features["label"]
    names = [feature.int2str(c) if isinstance(feature, ClassLabel) else str(c) for c in order]
    remapped = {s: _with_incremental_labels(dsets[s], labels[s], lookup, names) for s in ("train", "test")}
    per_class = {"train": train_per_class, "test": test_per_class}

    experiences = []
    for t in range(len(order) // k):
        task_classes = order[t * k:(t + 1) * k]
        task_desc = ", ".join(_class_name(dsets, c) for c in task_classes)
        for split, other in (("train", "test"), ("test", "train")):
            missing = [c for c in task_classes if counts[split][c] == 0]
            if missing:
                many = len(missing) > 1
                found = ", ".join(_class_name(dsets, c) for c in missing)
                elsewhere = ", ".join(str(int(counts[other][c])) for c in missing)
                raise ValueError(f"{_where(dname, split, 'label', t, task_desc)}: class{'es' if many else ''} "
                                 f"{found} {'have' if many else 'has'} no {split} examples ({elsewhere} in "
                                 f"split {other!r}); every class of a task needs train and test examples. "
                                 f"Add {split} rows, or leave the class out of the stream with "
                                 "min_examples_per_class or max_classes")
        parts = {}
        for part, split in enumerate(("train", "test")):
            idx = np.flatnonzero(np.isin(labels[split], task_classes))
            if split == "train" and validation_per_class:
                held, idx = _carve_validation(labels[split], idx, validation_per_class,
                                              _rng(seed, _VALIDATION, t), dname, t, task_desc)
                parts["validation"] = _ordered(remapped[split], held, None)
            # The test examples of a class are drawn by a generator keyed on the class's original label
            # alone (a fixed test set): every seed and class order is scored on the same examples.
            draw = _rng(seed, _SUBSAMPLE, t, part) if split == "train" else None
            idx = _subsample_per_class(labels[split], idx, per_class[split], draw)
            rng = _rng(seed, _STREAM_ORDER, t) if split == "train" else None
            parts[split] = _ordered(remapped[split], idx, rng)
        experiences.append(Experience(t, f"{dname}/task{t}", list(range(t * k, (t + 1) * k)),
                                      parts["train"], parts["test"],
                                      {"original_classes": task_classes, "class_names": names[t * k:(t + 1) * k]},
                                      parts.get("validation")))
    return experiences
