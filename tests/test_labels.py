"""Labels travel with an adapter (id2label, class order, history), through the local Hub:
scored against the dataset's own labels, evaluated under another seed's class order, and
continued on a new stream whose new classes come after the known ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset
from huggingface_hub import hf_hub_download

from hf_clroute.bench.harness.suites import SuiteConfig, build_stream, load_suite_backbone
from hf_clroute.cli import main
from hf_clroute.core.labels import align_stream
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import CLModel
from hf_clroute.data import Experience, column_array, load_labeled_dataset
from hf_clroute.engine import ContinualTrainer, TrainingConfig

FASHION = ClassLabel(names=["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                            "Bag", "Ankle boot"])


def _suite(tiny_suite, root, name: str, classes: int) -> str:
    """``classes`` classes of the small Fashion-MNIST copy in 2 tasks, every test image of them (so any
    seed scores the same images), on the tiny ViT."""
    suite = json.loads(tiny_suite.read_text())
    suite.update(name=name, dataset=str(root / "fashion-small"), max_classes=classes, train_per_class=None,
                 test_per_class=None, quick={}, probe_forgetting=False,
                 training={"batch_size": 8, "learning_rate": 0.001})
    path = root / f"{name}.json"
    path.write_text(json.dumps(suite))
    return str(path)


@pytest.fixture(scope="module")
def suites(tiny_suite, tmp_path_factory):
    """Two suites over a local copy of real Fashion-MNIST (its ClassLabel names), classes 0-5,
    16 train and 40 test images each: 4 classes, and the same 4 plus 2 new ones."""
    root = tmp_path_factory.mktemp("label_suites")
    (root / "fashion-small").mkdir()
    source = load_labeled_dataset("fashion_mnist")
    for split, n in (("train", 16), ("test", 40)):
        labels = column_array(source[split])
        keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:n] for c in range(6)]))
        source[split].select(keep).to_parquet(str(root / "fashion-small" / f"{split}.parquet"))
    return {"four": _suite(tiny_suite, root, "fashion-4", 4), "six": _suite(tiny_suite, root, "fashion-6", 6),
            "data": str(root / "fashion-small")}


@pytest.fixture(scope="module")
def trained(suites, tmp_path_factory):
    """NCM and finetune adapters trained on the 4-class stream of seed 0 (bench run directory)."""
    out = tmp_path_factory.mktemp("labels_run") / "four"
    assert main(["bench", "--suite", suites["four"], "--methods", "ncm,finetune", "--seeds", "0", "--out", str(out),
                 "--no-progress"]) == 0
    return out


def _overall(text: str) -> float:
    return float(re.search(r"all \d+ test examples: accuracy ([\d.]+)%", text).group(1))


def _dataset_accuracy(model: CLModel, suites: dict, classes: int) -> float:
    """Accuracy of ``model.predict`` names against the dataset's own label names, every test image."""
    test = load_labeled_dataset(suites["data"])["test"]
    test = test.select(np.flatnonzero(column_array(test) < classes))
    _, collator = load_suite_backbone(SuiteConfig.load(suites["four"]))
    rows = [test[i] for i in range(len(test))]
    names = model.predict(**{k: v for k, v in collator(rows).items() if k != "labels"})
    return 100 * sum(name == FASHION.int2str(r["label"]) for name, r in zip(names, rows, strict=True)) / len(rows)


def test_labels_are_recorded_pushed_and_scored_by_name(trained, suites, hub_server, hub_repo_id, capsys, monkeypatch):
    config = json.loads((trained / "adapters" / "ncm" / "hf_clroute_config.json").read_text())
    stream = build_stream(SuiteConfig.load(suites["four"]), 0)
    order = [c for e in stream for c in e.info["original_classes"]]
    assert config["class_order"] == order
    assert config["id2label"] == {str(i): FASHION.int2str(c) for i, c in enumerate(order)}
    assert config["label2id"] == {FASHION.int2str(c): i for i, c in enumerate(order)}
    assert [h["task"] for h in config["training_history"]] == ["fashion-small/task0", "fashion-small/task1"]
    assert [h["classes"] for h in config["training_history"]] == [e.info["class_names"] for e in stream]

    assert main(["push", str(trained), "--repo-id", hub_repo_id, "--method", "ncm"]) == 0
    card = Path(hf_hub_download(hub_repo_id, "README.md")).read_text()
    table = [f"| {i} | {FASHION.int2str(c)} | {c} |" for i, c in enumerate(order)]
    assert all(row in card for row in table) and card.index(table[0]) < card.index(table[-1])

    model = CLModel.from_pretrained(load_suite_backbone(SuiteConfig.load(suites["four"]))[0], hub_repo_id).eval()
    assert model.config.id2label[0] == model.config.id2label["0"] == FASHION.int2str(order[0])
    by_name = _dataset_accuracy(model, suites, 4)
    capsys.readouterr()

    # Seed 1 orders the classes differently; evaluate matches them to the adapter by name.
    assert [c for e in build_stream(SuiteConfig.load(suites["four"]), 1) for c in e.info["original_classes"]] != order
    scores = {}
    for seed in (0, 1):
        assert main(["evaluate", "--adapter", hub_repo_id, "--suite", suites["four"], "--seed", str(seed)]) == 0
        scores[seed] = _overall(capsys.readouterr().out)
    assert scores[0] == scores[1] == pytest.approx(by_name, abs=0.006)
    # Seed 1's ids read as they are would score other classes: the match by name is what makes it right.
    monkeypatch.setattr("hf_clroute.core.labels.align_stream", lambda stream, config, **kwargs: list(stream))
    assert main(["evaluate", "--adapter", hub_repo_id, "--suite", suites["four"], "--seed", "1"]) == 0
    assert _overall(capsys.readouterr().out) != scores[1]


def test_evaluate_refuses_classes_the_adapter_never_learned(trained, suites, capsys):
    adapter = str(trained / "adapters" / "finetune")
    assert main(["evaluate", "--adapter", adapter, "--suite", suites["six"]]) == 2
    err = capsys.readouterr().err
    assert "never learned" in err and "the adapter's classes by id are" in err and "'Sandal'" in err


def test_continue_from_the_hub_appends_new_classes(trained, suites, hub_server, hub_repo_id, tmp_path):
    assert main(["push", str(trained), "--repo-id", hub_repo_id, "--method", "finetune"]) == 0
    before = CLModel.from_pretrained(load_suite_backbone(SuiteConfig.load(suites["four"]))[0], hub_repo_id).config
    out = tmp_path / "six"
    assert main(["bench", "--suite", suites["six"], "--from-adapter", hub_repo_id, "--seeds", "0", "--out", str(out),
                 "--no-progress"]) == 0
    after = json.loads((out / "adapters" / "finetune" / "hf_clroute_config.json").read_text())
    # Known classes keep their ids, the two new ones come after them, in the new stream's order.
    assert {k: after["id2label"][k] for k in before.id2label} == dict(before.id2label)
    new = [FASHION.int2str(c) for e in build_stream(SuiteConfig.load(suites["six"]), 0)
           for c in e.info["original_classes"] if c >= 4]
    assert [after["id2label"]["4"], after["id2label"]["5"]] == new
    assert after["class_order"][:4] == before.class_order and sorted(after["class_order"]) == list(range(6))
    streams = [h["stream"] for h in after["training_history"]]
    assert streams == ["fashion-4 (seed 0)"] * 2 + ["fashion-6 (seed 0)"] * 2

    assert main(["push", str(out), "--repo-id", hub_repo_id, "--method", "finetune"]) == 0
    card = Path(hf_hub_download(hub_repo_id, "README.md", force_download=True)).read_text()
    assert "stream `fashion-4 (seed 0)`" in card and "stream `fashion-6 (seed 0)`" in card
    assert f"Continued from:** `{hub_repo_id}`" in card and "| 5 | " in card
    model = CLModel.from_pretrained(load_suite_backbone(SuiteConfig.load(suites["six"]))[0], hub_repo_id,
                                    force_download=True)
    assert model.head.num_classes == 6
    assert main(["evaluate", "--adapter", hub_repo_id, "--suite", suites["six"], "--seed", "3"]) == 0


def _named_experience(names: list[str], ids: list[int], task: int = 0) -> Experience:
    """A tiny hand-made experience: ``ids`` as labels, ClassLabel names ``names`` (by id)."""
    feature = ClassLabel(names=[names[ids.index(i)] if i in ids else f"unused{i}" for i in range(max(ids) + 1)])
    rows = {"features": np.random.default_rng(0).normal(size=(2 * len(ids), 32)).astype(np.float32).tolist(),
            "label": [i for i in ids for _ in range(2)]}
    ds = Dataset.from_dict(rows).cast_column("label", feature)
    return Experience(task, f"toy/task{task}", ids, ds, ds, {"class_names": names, "original_classes": ids})


def test_python_api_remaps_or_refuses_colliding_ids(trained, suites):
    from hf_clroute.bench.harness.feature_cache import FeatureCollator

    model = CLModel.from_pretrained(load_suite_backbone(SuiteConfig.load(suites["four"]))[0],
                                    trained / "adapters" / "finetune")
    known = dict(model.config.id2label)
    clash = _named_experience(["Sandal", known["0"]], [0, 1])
    # Calling the hooks by hand with ids that collide is refused, naming the class and both names.
    with pytest.raises(ValueError, match="already uses id 0"):
        model.begin_task(clash, StepContext(task_id=0))
    assert dict(model.config.id2label) == known
    # The trainer renumbers by name: Sandal is new (id 4), the known class keeps its id.
    trainer = ContinualTrainer(model, [clash], TrainingConfig(batch_size=4, progress=False), FeatureCollator())
    assert trainer.stream[0].classes == [4, 0]
    assert sorted(set(trainer.stream[0].train["label"])) == [0, 4]
    trainer.fit()
    assert model.config.id2label[4] == "Sandal" and model.head.num_classes == 5
    # Without names there is nothing to match: ids that collide are refused, not merged.
    unnamed = Experience(0, "plain/task0", [0, 1], Dataset.from_dict({"features": [[0.0] * 32] * 2, "label": [0, 1]}),
                         Dataset.from_dict({"features": [[0.0] * 32] * 2, "label": [0, 1]}))
    assert align_stream([unnamed], model.config)[0] is unnamed
    with pytest.raises(ValueError, match="already uses id 0"):
        ContinualTrainer(model, [unnamed], TrainingConfig(batch_size=4, progress=False), FeatureCollator()).fit()


def test_predict_gives_names_and_config_roundtrips(trained, suites):
    model = CLModel.from_pretrained(load_suite_backbone(SuiteConfig.load(suites["four"]))[0],
                                    trained / "adapters" / "finetune").eval()
    batch = {"pixel_values": torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    ids = model(**batch).logits.argmax(-1).tolist()
    assert model.predict(**batch) == [model.config.id2label[i] for i in ids]
    again = type(model.config).from_dict(json.loads(model.config.to_json_string()))
    assert again == model.config and again.id2label[1] == model.config.id2label["1"]


def test_run_config_from_adapter_continues_and_resumes(trained, suites, tmp_path):
    """training/train_continual.py with "from_adapter": stopped mid-stream and resumed, the adapter
    ends with the old classes, the new ones after them, and each task once in its history."""
    import argparse
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "training" / "train_continual.py"
    spec = importlib.util.spec_from_file_location("train_continual", script)
    train_continual = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_continual)
    adapter = trained / "adapters" / "finetune"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"suite": suites["six"], "method": "finetune", "output_dir": str(tmp_path / "out"),
                                "from_adapter": str(adapter), "training": {"progress": False}}))
    config = train_continual.load_run_config(str(path))
    stopped = train_continual.training_function(config, argparse.Namespace(resume=False, stop_after_steps=8))
    assert not stopped["finished"]
    done = train_continual.training_function(config, argparse.Namespace(resume=True, stop_after_steps=0))
    assert done["finished"] and done["from_adapter"] == str(adapter)
    before = json.loads((adapter / "hf_clroute_config.json").read_text())
    after = json.loads((tmp_path / "out" / "adapter" / "hf_clroute_config.json").read_text())
    assert {k: after["id2label"][k] for k in before["id2label"]} == before["id2label"] and len(after["id2label"]) == 6
    assert [h["task"] for h in after["training_history"]] == ["fashion-small/task0", "fashion-small/task1"] * 2

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({**json.loads(path.read_text()), "method": "ncm"}))
    with pytest.raises(ValueError, match="--from-adapter continues one 'finetune' adapter"):
        train_continual.load_run_config(str(wrong))
