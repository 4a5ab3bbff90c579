"""Load and validate any labelled dataset into the package's canonical form.

Whatever the origin (a recipe from :data:`~hf_clroute.data.sources.SOURCES`, a
local directory or file, or a Hub dataset id for users online), the result is
a ``DatasetDict`` with exactly the splits ``train`` and ``test`` and the
canonical columns ``image`` + ``label`` (image modality) or ``text`` + ``label``
(text modality), ``label`` being a ``ClassLabel``.  Stream builders and
collators rely on these names, so all renaming and checking happens here, once,
with errors that name the dataset and the column at fault.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import (
    Array2D,
    Array3D,
    ClassLabel,
    Dataset,
    DatasetDict,
    Image,
    LargeList,
    List,
    Value,
    load_dataset,
)
from datasets.exceptions import DatasetGenerationError

from hf_clroute.data.sources import SOURCES, load_source

__all__ = ["load_labeled_dataset", "load_text_corpus", "infer_modality", "column_array"]

Modality = Literal["image", "text"]
PathOrName = str | os.PathLike | Mapping[str, Any]

_BUILDER_BY_SUFFIX = {
    ".parquet": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".txt": "text",
}
_STRING_DTYPES = {"string", "large_string"}
# Words datasets recognises as split names in file and folder names -> the split they mean.
_SPLIT_WORDS = {
    "train": "train", "training": "train", "test": "test", "testing": "test", "validation": "validation",
    "valid": "validation", "val": "validation", "dev": "validation", "eval": "validation",
    "evaluation": "validation",
}


def _describe(name_or_path: PathOrName) -> str:
    return str(name_or_path) if not isinstance(name_or_path, Mapping) else str(dict(name_or_path))


def _load_raw(name_or_path: PathOrName, column: str) -> DatasetDict:
    """Dispatch on the kind of reference: source name, local file/dir, data_files mapping, Hub id.

    Local files are checked before ``datasets`` reads them, so a missing, empty
    or unreadable file is reported with the dataset, the split and ``column``
    (the column the caller needs) rather than as a ``DatasetGenerationError``.
    """
    name = _describe(name_or_path)
    if isinstance(name_or_path, Mapping):
        # {"train": "a.parquet", "test": "b.parquet"}: builder from the files' suffix.
        files = {str(split): [Path(str(f)).expanduser() for f in _as_list(refs)]
                 for split, refs in name_or_path.items()}
        if not files or not all(files.values()):
            raise ValueError(f"dataset {name!r}: the split -> file mapping names no files")
        builders = {_builder_for(f) for paths in files.values() for f in paths}
        if len(builders) > 1:
            raise ValueError(f"dataset {name!r}: the files mix formats ({sorted(builders)}); "
                             "give every split files of one type")
        _check_files(name, files, column)
        data_files = {split: [str(f) for f in paths] for split, paths in files.items()}
        return _named(_read(name, builders.pop(), data_files=data_files), _mapping_name(files))
    ref = str(name_or_path)
    if ref in SOURCES:
        return load_source(ref)
    path = Path(ref).expanduser()
    if path.is_file():
        builder = _builder_for(path)
        _check_files(name, {"train": [path]}, column)
        return _named(_read(name, builder, data_files={"train": str(path)}), path.stem)
    if path.is_dir():
        _check_files(name, _files_in(path), column)
        # datasets infers the builder (parquet/json/csv/imagefolder) and split names from the files.
        return _named(_read(name, str(path)), path.name)
    if path.suffix.lower() in _BUILDER_BY_SUFFIX or ref.startswith((".", "/", "~")):
        raise ValueError(f"dataset {ref!r}: no such file or directory (and not a source: {sorted(SOURCES)})")
    return load_dataset(ref)  # a Hub dataset id (works online, or offline from the HF cache)


def _as_list(refs: Any) -> list[Any]:
    return list(refs) if isinstance(refs, (list, tuple)) else [refs]


def _read(name: str, builder: str, **kwargs: Any) -> DatasetDict:
    """``load_dataset`` with a read failure re-raised as a ValueError naming the dataset."""
    try:
        return load_dataset(builder, **kwargs)
    except DatasetGenerationError as err:
        cause = err.__cause__ or err.__context__ or err
        raise ValueError(f"dataset {name!r}: could not be read: {cause}") from err


def _mapping_name(files: Mapping[str, list[Path]]) -> str:
    """A name for data given as a split -> file mapping: the train file's stem, or its folder's
    name when the stem only names the split (``data/train.parquet`` -> ``data``)."""
    first = files.get("train", next(iter(files.values())))[0]
    stem = first.name.split(".")[0]
    return first.parent.name or stem if stem.lower() in {s.lower() for s in files} else stem


def _files_in(root: Path) -> dict[str, list[Path]]:
    """The data files under a directory, keyed by the split their path names (``train`` if none),
    as ``datasets`` assigns them."""
    out: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        if _suffix(path) not in _BUILDER_BY_SUFFIX or path.name.startswith(".") or not path.is_file():
            continue
        words = set(re.split(r"[^a-z]+", path.relative_to(root).as_posix().lower()))
        split = next((_SPLIT_WORDS[w] for w in _SPLIT_WORDS if w in words), "train")
        out.setdefault(split, []).append(path)
    return out


def _check_files(name: str, files: Mapping[str, list[Path]], column: str) -> None:
    """Every file exists and holds rows (a parquet file's row count is read from its footer)."""
    for split, paths in files.items():
        where = f"dataset {name!r}, split {split!r}, column {column!r}"
        for path in paths:
            if not path.is_file():
                raise ValueError(f"{where}: no such file {str(path)!r}")
            if path.stat().st_size == 0:
                raise ValueError(f"{where}: the split is empty (file {str(path)!r} has 0 bytes)")
            if _suffix(path) != ".parquet":
                continue
            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except (OSError, pa.ArrowException) as err:
                raise ValueError(f"{where}: file {str(path)!r} is not a readable parquet file: {err}") from err
            if rows == 0:
                problem = "the split is empty" if len(paths) == 1 else "datasets cannot read an empty file; remove it"
                raise ValueError(f"{where}: {problem} (file {str(path)!r} has 0 rows)")


def _named(splits: DatasetDict, name: str) -> DatasetDict:
    """Name local data after its file/dir (datasets would call it "parquet", "json", ...)."""
    for ds in splits.values():
        ds.info.dataset_name = name
    return splits


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def _builder_for(path: Path) -> str:
    suffix = _suffix(path)
    if suffix not in _BUILDER_BY_SUFFIX:
        raise ValueError(f"dataset {str(path)!r}: unsupported file type {suffix!r}; "
                         f"use one of {sorted(_BUILDER_BY_SUFFIX)} or a directory")
    return _BUILDER_BY_SUFFIX[suffix]


def infer_modality(feature: Any) -> Modality | None:
    """``image`` for image/array features, ``text`` for string features, else None."""
    if isinstance(feature, (Image, Array2D, Array3D, List, LargeList)):
        return "image"
    if isinstance(feature, Value) and feature.dtype in _STRING_DTYPES:
        return "text"
    return None


def column_array(ds: Dataset, column: str = "label") -> np.ndarray:
    """One column as a numpy array, read straight from arrow (no per-row formatting, no decoding).

    ``ds[column]`` is a lazy per-row iterator in datasets 5; the arrow slice
    honours an indices mapping (after ``select``) and is far faster.
    """
    table = ds.select_columns([column]).with_format("arrow")[:]
    return table.column(column).to_numpy(zero_copy_only=False)


def _two_splits(raw: DatasetDict | Dataset, name: str, train_split: str, test_split: str,
                test_fraction: float, seed: int, column: str) -> DatasetDict:
    """Pick train/test, carving a deterministic test split from train when there is none."""
    if isinstance(raw, Dataset):
        raw = DatasetDict({train_split: raw})
    if train_split not in raw:
        raise ValueError(f"dataset {name!r}: no split {train_split!r}; available splits: {list(raw)}")
    if test_split in raw:
        return DatasetDict({"train": raw[train_split], "test": raw[test_split]})
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"dataset {name!r}: test_fraction must be in (0, 1), got {test_fraction}")
    if len(raw[train_split]) < 2:
        raise ValueError(f"dataset {name!r}, split {train_split!r}, column {column!r}: "
                         f"{len(raw[train_split])} rows, too few to carve a test split from "
                         f"(test_fraction={test_fraction}); give a test split")
    parts = raw[train_split].train_test_split(test_size=test_fraction, seed=seed, shuffle=True)
    return DatasetDict({"train": parts["train"], "test": parts["test"]})


def _pick_input_column(ds: Dataset, name: str, input_column: str | None, modality: Modality | None,
                       label_column: str) -> str:
    """The user's input column, else the canonical one for the modality, else the first that fits."""
    if input_column is not None:
        _require_column(ds, name, input_column, "input")
        return input_column
    wanted = [modality] if modality else ["image", "text"]
    for col in wanted:
        if col in ds.column_names and col != label_column:
            return col
    for col, feature in ds.features.items():
        if col != label_column and infer_modality(feature) in wanted:
            return col
    raise ValueError(f"dataset {name!r}: cannot find an input column (wanted {modality or 'image or text'}); "
                     f"available columns: {ds.column_names}; pass input_column=")


def _require_column(ds: Dataset, name: str, column: str, role: str) -> None:
    if column not in ds.column_names:
        raise ValueError(f"dataset {name!r}: {role} column {column!r} not found; "
                         f"available columns: {ds.column_names}")


def _canonical_columns(ds: Dataset, name: str, input_column: str, label_column: str,
                       canonical_input: str) -> Dataset:
    """Keep only the input and label columns, renamed to their canonical names."""
    _require_column(ds, name, label_column, "label")
    ds = ds.select_columns([input_column, label_column])
    renames = {old: new for old, new in ((input_column, canonical_input), (label_column, "label")) if old != new}
    return ds.rename_columns(renames) if renames else ds


def _validate_labels(splits: DatasetDict, name: str, label_column: str) -> DatasetDict:
    """Check labels are non-negative integers within the ClassLabel range; make label a ClassLabel.

    String labels (ImageNet-R's WordNet ids, intent names) become a ClassLabel whose names are the
    sorted strings of every split, so the same string has the same id in train and test and the
    names travel with the adapter as ``id2label``."""
    if all(ds.features["label"] == Value("string") for ds in splits.values()):
        names = sorted({str(v) for ds in splits.values() for v in ds.unique("label")})
        splits = splits.cast_column("label", ClassLabel(names=names))
    feature = splits["train"].features["label"]
    for split, ds in splits.items():
        other = ds.features["label"]
        is_int = isinstance(other, ClassLabel) or (isinstance(other, Value) and other.dtype.startswith(("int", "uint")))
        if not is_int:
            raise ValueError(f"dataset {name!r}, split {split!r}: label column {label_column!r} has type {other}, "
                             "not integers; encode it first (e.g. Dataset.class_encode_column)")
    labels = {split: column_array(ds) for split, ds in splits.items()}
    top = max(int(arr.max()) for arr in labels.values())
    num_classes = feature.num_classes if isinstance(feature, ClassLabel) else top + 1
    for split, arr in labels.items():
        bad = arr[(arr < 0) | (arr >= num_classes)]
        if bad.size:
            raise ValueError(f"dataset {name!r}, split {split!r}: label column {label_column!r} has value "
                             f"{int(bad[0])} outside the class range [0, {num_classes})")
    if isinstance(feature, ClassLabel):
        return splits
    # Integer labels become a ClassLabel so every later step knows the number of classes.
    return splits.cast_column("label", ClassLabel(names=[str(i) for i in range(num_classes)]))


def _check_not_empty(splits: DatasetDict, name: str, column: str) -> None:
    for split, ds in splits.items():
        if len(ds) == 0:
            raise ValueError(f"dataset {name!r}, split {split!r}, column {column!r}: the split is empty (0 rows)")


def load_labeled_dataset(
    name_or_path: PathOrName,
    *,
    input_column: str | None = None,
    label_column: str = "label",
    modality: Modality | None = None,
    train_split: str = "train",
    test_split: str = "test",
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DatasetDict:
    """Load a labelled dataset as ``DatasetDict(train=..., test=...)`` with canonical columns.

    ``name_or_path`` is a source name from ``SOURCES``, a local file (parquet,
    json/jsonl, csv) or directory (any layout ``datasets`` understands,
    imagefolder included), a ``{split: file}`` mapping, or a Hub dataset id.
    The input column (``input_column``, or the canonical / first image-or-text
    column) is renamed to ``image`` or ``text`` by ``modality`` (inferred from
    its feature type when not given), ``label_column`` to ``label``; other
    columns are dropped.  Without ``test_split`` a test split of
    ``test_fraction`` is carved from train with ``seed``.

    Raises ``ValueError`` (naming the dataset and the column) for a missing
    column, non-integer labels, labels outside the ``ClassLabel`` range or
    negative, an unknown modality, or an empty split.
    """
    name = _describe(name_or_path)
    if modality not in (None, "image", "text"):
        raise ValueError(f"dataset {name!r}: modality must be 'image' or 'text', got {modality!r}")
    splits = _two_splits(_load_raw(name_or_path, label_column), name, train_split, test_split,
                         test_fraction, seed, label_column)
    _check_not_empty(splits, name, label_column)
    column = _pick_input_column(splits["train"], name, input_column, modality, label_column)
    inferred = infer_modality(splits["train"].features[column])
    modality = modality or inferred
    if modality is None:
        raise ValueError(f"dataset {name!r}: cannot infer the modality of column {column!r} "
                         f"({splits['train'].features[column]}); pass modality='image' or 'text'")
    splits = DatasetDict({split: _canonical_columns(ds, name, column, label_column, modality)
                          for split, ds in splits.items()})
    return _validate_labels(splits, name, label_column)


def load_text_corpus(
    name_or_path: PathOrName,
    text_column: str = "text",
    *,
    train_split: str = "train",
    test_split: str = "test",
    test_fraction: float = 0.1,
    seed: int = 0,
) -> DatasetDict:
    """Load a text corpus (one LM domain) as ``DatasetDict(train, test)`` with one ``text`` column.

    Same references as :func:`load_labeled_dataset`: a source name, a local
    ``.txt`` file (one line per row, line breaks removed), a directory of
    ``.txt`` (or parquet/json/csv) files, a parquet/json/csv file with a
    ``text_column``, a ``{"train": path, "test": path}`` mapping (files of one
    type) or a Hub dataset id.  Without a test split, ``test_fraction`` of the
    rows are held out with ``seed``.  Missing, empty or unreadable files and a
    missing or non-string column raise ``ValueError`` naming the dataset, the
    split and the column.
    """
    name = _describe(name_or_path)
    splits = _two_splits(_load_raw(name_or_path, text_column), name, train_split, test_split,
                         test_fraction, seed, text_column)
    _check_not_empty(splits, name, text_column)
    for split, ds in splits.items():
        _require_column(ds, name, text_column, "text")
        if infer_modality(ds.features[text_column]) != "text":
            raise ValueError(f"dataset {name!r}, split {split!r}: text column {text_column!r} has type "
                             f"{ds.features[text_column]}, not strings")
    splits = splits.select_columns([text_column])
    return splits.rename_column(text_column, "text") if text_column != "text" else splits
