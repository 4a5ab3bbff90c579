"""Data problems raise before training starts, with a message naming where the problem is.

Every error names the dataset, the split, the column, the task (where one
applies) and the offending value.  Also: the validation split carved from the
training data by ``class_incremental(..., validation_per_class=n)``.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value  # noqa: E402

from hf_clroute.data import (  # noqa: E402
    Experience,
    class_incremental,
    column_array,
    load_labeled_dataset,
    load_source,
    load_text_corpus,
    validation_stream,
)

# Fields of a suite JSON file that shape the class-incremental stream.
SUITE_FIELDS = {"max_classes", "min_examples_per_class", "n_tasks", "label_column", "input_column",
                "train_per_class", "test_per_class"}


def _split(labels: list[int], prefix: str, num_classes: int) -> Dataset:
    features = Features({"id": Value("string"), "text": Value("string"), "label": ClassLabel(num_classes=num_classes)})
    rows = {"id": [f"{prefix}{i}" for i in range(len(labels))],
            "text": [f"{prefix} example {i} of class {c}" for i, c in enumerate(labels)], "label": labels}
    return Dataset.from_dict(rows, features=features)


def toy(train: list[int], test: list[int], num_classes: int = 10) -> DatasetDict:
    """A text DatasetDict with unique ``id``/``text`` per row and a ClassLabel ``label``."""
    return DatasetDict(train=_split(train, "train", num_classes), test=_split(test, "test", num_classes))


def balanced(n_classes: int, train_per: int, test_per: int) -> DatasetDict:
    return toy([c for c in range(n_classes) for _ in range(train_per)],
               [c for c in range(n_classes) for _ in range(test_per)], num_classes=n_classes)


def _write(path: Path, labels: list[int], texts: str = "row") -> Path:
    pq.write_table(pa.table({"text": [f"{texts} {i}" for i in range(len(labels))],
                             "label": pa.array(labels, pa.int64())}), path)
    return path


def _names_all(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in: {message}"


# --------------------------------------------------------------------------- a. class missing from test


def test_a_class_in_train_missing_from_test():
    # Class 3 has training rows but no test rows: today its task would score it as if it did not exist.
    dsets = toy([0, 1, 2, 3] * 3, [0, 1, 2] * 2)
    with pytest.raises(ValueError) as err:
        class_incremental(dsets, class_order=[0, 1, 2, 3], n_tasks=2, name="toy")
    _names_all(str(err.value), "dataset 'toy'", "split 'test'", "column 'label'", "task 1", "class 3",
               "no test examples", "3 in split 'train'")


def test_a_class_in_test_missing_from_train():
    dsets = toy([0, 1, 2] * 3, [0, 1, 2, 3] * 2)
    with pytest.raises(ValueError) as err:
        class_incremental(dsets, class_order=[0, 1, 2, 3], n_tasks=2, name="toy")
    _names_all(str(err.value), "dataset 'toy'", "split 'train'", "column 'label'", "task 1", "class 3",
               "no train examples")


# --------------------------------------------------------------------------- b. empty test split


def test_b_experience_with_empty_test_split():
    train = _split([0, 1, 0, 1], "train", 2)
    with pytest.raises(ValueError) as err:
        Experience(1, "toy/task1", [0, 1], train, train.select([]))
    _names_all(str(err.value), "dataset 'toy'", "split 'test'", "column 'label'", "task 1", "0 rows")


def test_b_class_incremental_with_empty_test_split():
    dsets = toy([0, 1] * 4, [])
    with pytest.raises(ValueError) as err:
        class_incremental(dsets, n_tasks=1, name="toy")
    _names_all(str(err.value), "dataset 'toy'", "split 'test'", "column 'label'", "0 rows")
    with pytest.raises(ValueError, match=r"toy.*test_per_class must be an integer >= 1.*got 0"):
        class_incremental(toy([0, 1] * 4, [0, 1]), n_tasks=1, test_per_class=0, name="toy")


# --------------------------------------------------------------------------- c. labels outside the task


@pytest.mark.parametrize("split", ["train", "test"])
def test_c_labels_outside_the_tasks_classes(split):
    good = _split([0, 1, 0, 1], split, 10)
    bad = _split([0, 1, 5, 1, 5], split, 10)
    parts = {"train": good, "test": good, split: bad}
    with pytest.raises(ValueError) as err:
        Experience(0, "toy/task0", [0, 1], parts["train"], parts["test"])
    _names_all(str(err.value), "dataset 'toy'", f"split {split!r}", "column 'label'", "task 0", "label 5",
               "2 rows", "[0, 1]")


def test_c_validation_split_is_checked_too():
    good = _split([0, 1], "train", 10)
    with pytest.raises(ValueError, match=r"split 'validation', column 'label', task 0 .*label 7"):
        Experience(0, "toy/task0", [0, 1], good, good, validation=_split([7], "val", 10))


# --------------------------------------------------------------------------- d. empty train split


def test_d_empty_train_split():
    with pytest.raises(ValueError) as err:
        class_incremental(toy([], [0, 1]), n_tasks=1, name="toy")
    _names_all(str(err.value), "dataset 'toy'", "split 'train'", "column 'label'", "0 rows")
    # An experience built by hand: today only train_stream() fails ("Unable to shard a dataset of size 0").
    test = _split([0, 1], "test", 2)
    with pytest.raises(ValueError) as err:
        Experience(2, "toy/task2", [0, 1], test.select([]), test)
    _names_all(str(err.value), "dataset 'toy'", "split 'train'", "column 'label'", "task 2", "0 rows")


def test_d_empty_train_file(tmp_path):
    empty = _write(tmp_path / "train.parquet", [])
    test = _write(tmp_path / "test.parquet", [0, 1])
    with pytest.raises(ValueError) as err:
        load_labeled_dataset({"train": str(empty), "test": str(test)}, label_column="label")
    _names_all(str(err.value), "split 'train'", "column 'label'", "train.parquet", "0 rows")
    with pytest.raises(ValueError, match=r"empty\.parquet.*split 'train', column 'label'.*0 rows"):
        load_labeled_dataset(_write(tmp_path / "empty.parquet", []))


# --------------------------------------------------------------------------- e. label beyond the ClassLabel


def test_e_label_beyond_the_classlabel_names():
    features = Features({"text": Value("string"), "label": ClassLabel(num_classes=10)})
    # datasets refuses to encode label 15 for 10 names, but a table written elsewhere can hold it.
    table = pa.table({"text": list("abcdef"), "label": [0, 1, 15, 0, 1, 2]}, schema=features.arrow_schema)
    dsets = DatasetDict(train=Dataset(table), test=Dataset(table.slice(0, 2)))
    with pytest.raises(ValueError) as err:
        class_incremental(dsets, n_tasks=1, name="digits")
    _names_all(str(err.value), "dataset 'digits'", "split 'train'", "column 'label'", "label 15",
               "10 names")


# --------------------------------------------------------------------------- f. empty test file


def test_f_empty_test_parquet_file(tmp_path):
    train = _write(tmp_path / "train.parquet", [0, 1, 0, 1])
    no_rows = _write(tmp_path / "test.parquet", [])
    with pytest.raises(ValueError) as err:
        load_labeled_dataset({"train": str(train), "test": str(no_rows)})
    _names_all(str(err.value), "split 'test'", "column 'label'", str(no_rows), "0 rows")
    zero_bytes = tmp_path / "blank.parquet"
    zero_bytes.write_bytes(b"")
    with pytest.raises(ValueError) as err:
        load_labeled_dataset({"train": str(train), "test": str(zero_bytes)}, label_column="label")
    _names_all(str(err.value), "split 'test'", "column 'label'", "blank.parquet", "0 bytes")
    folder = tmp_path / "digits"
    folder.mkdir()
    _write(folder / "train.parquet", [0, 1, 0, 1])
    _write(folder / "test.parquet", [])
    with pytest.raises(ValueError) as err:
        load_labeled_dataset(folder)
    _names_all(str(err.value), "digits", "split 'test'", "column 'label'", "0 rows")


def test_f_unreadable_or_missing_files(tmp_path):
    train = _write(tmp_path / "train.parquet", [0, 1])
    garbage = tmp_path / "test.parquet"
    garbage.write_bytes(b"not a parquet file")
    with pytest.raises(ValueError, match=r"split 'test', column 'label'.*not a readable parquet file"):
        load_labeled_dataset({"train": str(train), "test": str(garbage)})
    with pytest.raises(ValueError, match=r"split 'test', column 'label'.*no such file"):
        load_labeled_dataset({"train": str(train), "test": str(tmp_path / "missing.parquet")})
    with pytest.raises(ValueError, match=r"mix formats"):
        load_labeled_dataset({"train": str(train), "test": str(tmp_path / "test.csv")})


# --------------------------------------------------------------------------- g. a stray label


@pytest.mark.parametrize("in_test", [False, True])
def test_g_stray_label_is_named(tmp_path, in_test):
    train = [i % 10 for i in range(150)] + [42]
    test = [i % 10 for i in range(50)] + ([42] if in_test else [])
    ref = {"train": str(_write(tmp_path / "digits_train.parquet", train)),
           "test": str(_write(tmp_path / "digits_test.parquet", test))}
    dsets = load_labeled_dataset(ref)
    with pytest.raises(ValueError) as err:
        class_incremental(dsets, n_tasks=5)
    message = str(err.value)
    splits = "splits 'train' and 'test'" if in_test else "split 'train'"
    _names_all(message, "dataset 'digits_train'", splits, "column 'label'", "Label 42 looks stray",
               f"1 train and {int(in_test)} test examples", "labels are 0-9")
    # The hint names only options that both class_incremental and suite JSON files take.
    assert "classes=" not in message and "class_order" not in message
    hinted = set(re.findall(r"\b(min_examples_per_class|max_classes|n_tasks)\b", message))
    assert hinted == {"min_examples_per_class", "max_classes", "n_tasks"}
    assert hinted <= SUITE_FIELDS and hinted <= set(inspect.signature(class_incremental).parameters)
    # Both suggested fixes work, and give the stream of the ten real classes.
    for fix in ({"max_classes": 10}, {"min_examples_per_class": 3}):
        exps = class_incremental(dsets, n_tasks=5, **fix)
        assert sorted(c for e in exps for c in e.info["original_classes"]) == list(range(10))
        assert sum(len(e.train) for e in exps) == 150


def test_tiling_error_without_stray_labels_lists_divisors():
    with pytest.raises(ValueError, match=r"toy.*6 classes cannot be split into 4 tasks.*divisor of 6 \(1, 2, 3, 6\)"):
        class_incremental(balanced(6, 3, 2), n_tasks=4, name="toy")


def test_non_integer_labels_and_missing_column():
    strings = DatasetDict(train=Dataset.from_dict({"text": ["a"], "label": ["cat"]}),
                          test=Dataset.from_dict({"text": ["b"], "label": ["dog"]}))
    with pytest.raises(ValueError, match=r"toy', split 'train', column 'label'.*not integers"):
        class_incremental(strings, n_tasks=1, name="toy")
    unlabelled = DatasetDict(train=Dataset.from_dict({"text": ["a"]}), test=Dataset.from_dict({"text": ["b"]}))
    with pytest.raises(ValueError, match=r"toy', split 'train', column 'label'.*no such column"):
        class_incremental(unlabelled, n_tasks=1, name="toy")


def test_min_examples_and_max_classes_select_classes():
    dsets = toy([c for c in range(6) for _ in range(c + 1)], list(range(6)), num_classes=6)
    exps = class_incremental(dsets, n_tasks=2, min_examples_per_class=4, seed=0)  # classes with >= 4 rows
    assert sorted(c for e in exps for c in e.info["original_classes"]) == [2, 3, 4, 5]
    exps = class_incremental(dsets, n_tasks=2, max_classes=4, seed=0)
    assert sorted(c for e in exps for c in e.info["original_classes"]) == [0, 1, 2, 3]
    exps = class_incremental(dsets, classes_per_task=1, class_order=[5, 1, 3, 0], max_classes=2)
    assert [e.info["original_classes"] for e in exps] == [[5], [1]]
    with pytest.raises(ValueError, match=r"toy.*no class has at least min_examples_per_class=99"):
        class_incremental(dsets, n_tasks=1, min_examples_per_class=99, name="toy")


# --------------------------------------------------------------------------- validation split


def _ids(ds: Dataset) -> list[str]:
    return [str(v) for v in column_array(ds, "id")]


def _hashes(ds: Dataset) -> set[str]:
    return {hashlib.sha1(str(t).encode()).hexdigest() for t in column_array(ds, "text")}


def _signature(exps: list[Experience]) -> list:
    return [(e.name, e.classes, e.info["original_classes"], _ids(e.train), _ids(e.test)) for e in exps]


def test_validation_split_is_disjoint_and_shaped_like_test():
    dsets = balanced(6, 12, 4)
    exps = class_incremental(dsets, n_tasks=3, seed=0, validation_per_class=3)
    plain = class_incremental(dsets, n_tasks=3, seed=0)
    assert [e.info["original_classes"] for e in exps] == [e.info["original_classes"] for e in plain]
    for e, p in zip(exps, plain, strict=True):
        val = e.validation
        assert len(val) == 3 * len(e.classes) and "validation=6" in repr(e)
        assert np.array_equal(np.bincount(column_array(val), minlength=6)[e.classes], [3, 3])
        assert set(column_array(val)) == set(e.classes) == set(column_array(e.test))
        assert val.column_names == e.test.column_names
        assert val.features["label"].names == e.test.features["label"].names
        # Same remapping as test: each original class maps to one incremental id in both.
        pairs = {(int(o), int(n)) for o, n in zip(column_array(val, "original_label"), column_array(val))}
        test_pairs = {(int(o), int(n)) for o, n in zip(column_array(e.test, "original_label"), column_array(e.test))}
        assert pairs == test_pairs
        # Disjoint from train and test by row id and by content hash; train loses exactly those rows.
        assert not set(_ids(val)) & set(_ids(e.train)) and not _hashes(val) & _hashes(e.train)
        assert not _hashes(val) & _hashes(e.test) and all(i.startswith("train") for i in _ids(val))
        assert set(_ids(e.train)) | set(_ids(val)) == set(_ids(p.train))
        assert _ids(e.test) == _ids(p.test)
        assert _ids(val) == sorted(_ids(val), key=lambda i: int(i[5:]))  # dataset order, like test


def test_validation_split_is_fixed_per_seed():
    dsets = balanced(4, 20, 5)
    a = class_incremental(dsets, n_tasks=2, seed=1, validation_per_class=4, train_per_class=8)
    b = class_incremental(dsets, n_tasks=2, seed=1, validation_per_class=4, train_per_class=8)
    c = class_incremental(dsets, n_tasks=2, seed=2, validation_per_class=4, train_per_class=8)
    assert _signature(a) == _signature(b) and [_ids(e.validation) for e in a] == [_ids(e.validation) for e in b]
    assert [_ids(e.validation) for e in a] != [_ids(e.validation) for e in c]
    for e in a:  # train_per_class subsamples what validation left
        assert len(e.train) == 16 and not set(_ids(e.train)) & set(_ids(e.validation))


def test_validation_zero_leaves_the_stream_unchanged():
    dsets = balanced(6, 12, 4)
    for kwargs in ({"n_tasks": 3, "seed": 0}, {"n_tasks": 2, "seed": 5, "train_per_class": 5, "test_per_class": 2}):
        default = class_incremental(dsets, **kwargs)
        zero = class_incremental(dsets, **kwargs, validation_per_class=0)
        assert _signature(zero) == _signature(default)
        assert all(e.validation is None for e in zero)
    with pytest.raises(ValueError, match=r"toy.*validation_per_class must be an integer >= 0.*-1"):
        class_incremental(dsets, n_tasks=3, validation_per_class=-1, name="toy")


def test_validation_zero_on_real_data_is_unchanged():
    mnist = load_source("mnist")
    kwargs = {"n_tasks": 5, "seed": 1, "train_per_class": 40, "test_per_class": 10}
    default, zero = class_incremental(mnist, **kwargs), class_incremental(mnist, **kwargs, validation_per_class=0)
    for d, z in zip(default, zero, strict=True):
        for split in ("train", "test"):
            assert getattr(d, split)._indices.equals(getattr(z, split)._indices)


def test_validation_on_real_data_disjoint_by_row_id():
    mnist = load_source("mnist")
    dsets = DatasetDict({split: mnist[split].add_column("id", [f"{split}{i}" for i in range(len(mnist[split]))])
                         for split in ("train", "test")})
    exps = class_incremental(dsets, n_tasks=5, seed=0, validation_per_class=20, train_per_class=50)
    for e in exps:
        assert len(e.validation) == 40 and len(e.train) == 100
        assert not set(_ids(e.validation)) & set(_ids(e.train))
        assert not set(_ids(e.validation)) & set(_ids(e.test))


def test_validation_needs_training_examples_left():
    dsets = toy([0, 0, 0, 1, 1], [0, 1], num_classes=2)
    with pytest.raises(ValueError) as err:
        class_incremental(dsets, n_tasks=1, validation_per_class=2, name="toy")
    _names_all(str(err.value), "dataset 'toy'", "split 'train'", "column 'label'", "task 0", "class 1",
               "2 train examples", "validation_per_class=2")


def test_validation_stream_scores_on_validation():
    dsets = balanced(4, 10, 3)
    exps = class_incremental(dsets, n_tasks=2, seed=0, validation_per_class=2)
    val = validation_stream(exps)
    assert [e.name for e in val] == [e.name for e in exps] and [e.classes for e in val] == [e.classes for e in exps]
    for v, e in zip(val, exps, strict=True):
        assert _ids(v.test) == _ids(e.validation) and _ids(v.train) == _ids(e.train)
        assert v.validation is None and v.info["evaluation_split"] == "validation"
        assert v.info["original_classes"] == e.info["original_classes"]
        assert not any(i.startswith("test") for i in _ids(v.test))
    with pytest.raises(ValueError, match=r"toy/task0.*no validation split.*validation_per_class"):
        validation_stream(class_incremental(dsets, n_tasks=2, name="toy"))


def test_text_corpus_errors_name_split_and_column(tmp_path):
    (tmp_path / "blank.txt").write_text("")
    (tmp_path / "lines.txt").write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match=r"split 'test', column 'text'.*blank\.txt.*0 bytes"):
        load_text_corpus({"train": str(tmp_path / "lines.txt"), "test": str(tmp_path / "blank.txt")})


def test_string_labels_are_encoded_with_their_names_shared_across_splits(tmp_path):
    """A Hub dataset labelled by strings (ImageNet-R's WordNet ids) loads as a ClassLabel of the
    sorted names of every split: one string, one id, in train and test alike."""
    from hf_clroute.data import load_labeled_dataset

    for split, labels in (("train", ["n02", "n01", "n03", "n01"]), ("test", ["n03", "n04", "n01"])):
        pq.write_table(pa.table({"text": [f"{split} {i}" for i in range(len(labels))], "label": labels}),
                       tmp_path / f"{split}.parquet")
    ds = load_labeled_dataset({"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet")})
    names = ds["train"].features["label"].names
    assert names == ["n01", "n02", "n03", "n04"] == ds["test"].features["label"].names
    assert ds["train"]["label"] == [1, 0, 2, 0] and ds["test"]["label"] == [2, 3, 0]
