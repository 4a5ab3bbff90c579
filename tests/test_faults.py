"""Every bad input and fault a new user met (issue: "no silent failure"), replayed through the command line.

Each gives one line ``hf-clroute: error: ...`` naming the file and the field (or the dataset, split
and row; or the checkpoint), exit code 2 and no traceback (``--debug`` shows it); none trains on
silently, and none loses a checkpoint: a refused resume leaves every checkpoint as it was, and the
run then resumes to the uninterrupted run's numbers.
"""

from __future__ import annotations

import errno
import io
import json
import math
import pathlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hf_clroute.cli import main
from hf_clroute.engine import checkpoint
from hf_clroute.errors import ResumeError, UserInputError

REPO = Path(__file__).resolve().parents[1]


def fails(argv: list[str], capsys: pytest.CaptureFixture, *expected: str) -> str:
    """Run the CLI, expect exit code 2 and one error line holding every ``expected`` part; return it."""
    return fails_with(2, argv, capsys, *expected)


@pytest.fixture(scope="module")
def suite_file(tiny_suite: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conftest's tiny MNIST suite, without probes or anytime evaluations: only what resume needs."""
    data = json.loads(tiny_suite.read_text())
    data.update(probe_forgetting=False, training={"batch_size": 8, "learning_rate": 0.001})
    path = tmp_path_factory.mktemp("faults") / "tiny.json"
    path.write_text(json.dumps(data))
    return path


def derived(tmp_path: Path, suite_file: Path, name: str = "bad.json", **fields) -> str:
    """A suite file: the tiny one with ``fields`` on top (``training`` and ``quick`` replace its own)."""
    data = {**json.loads(suite_file.read_text()), **fields}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# ---- types and ranges: refused before anything trains, naming the file and the field -------------------

@pytest.mark.parametrize("training, field, problem", [
    ({"epochs": 1.5}, "training.epochs", "an integer >= 1, got 1.5"),
    ({"epochs": "10"}, "training.epochs", "an integer >= 1, got '10'"),
    ({"learning_rate": "fast"}, "training.learning_rate", "a finite number > 0, got 'fast'"),
    ({"learning_rate": -0.001}, "training.learning_rate", "a finite number > 0, got -0.001"),
    ({"learning_rate": math.inf}, "training.learning_rate", "a finite number > 0, got inf"),
    ({"batch_size": 0}, "training.batch_size", "an integer >= 1, got 0"),
    ({"max_grad_norm": math.nan}, "training.max_grad_norm", "a finite number > 0, 0 or null"),
])
def test_a_bad_training_value_names_the_file_and_the_field(suite_file, tmp_path, capsys, training, field, problem):
    path = derived(tmp_path, suite_file, training=training)
    for command in (["bench", "--suite", path, "--seeds", "0", "--out", str(tmp_path / "out")],
                    ["train", "--suite", path, "--method", "finetune", "--output-dir", str(tmp_path / "run")]):
        fails(command, capsys, f"suite file {path}", field, problem)
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_a_string_batch_size_under_quick_is_refused(suite_file, tmp_path, capsys):
    path = derived(tmp_path, suite_file, quick={"training": {"batch_size": "10"}})
    fails(["bench", "--suite", path, "--quick", "--seeds", "0", "--out", str(tmp_path / "out")], capsys,
          f"suite file {path} (quick.training)", "training.batch_size must be an integer >= 1, got '10'")


def test_suite_fields_of_the_wrong_type_or_shape(suite_file, tmp_path, capsys):
    out = str(tmp_path / "out")
    five = derived(tmp_path, suite_file, n_tasks="five")
    fails(["bench", "--suite", five, "--seeds", "0", "--out", out], capsys, five,
          "n_tasks must be an integer, got 'five'")
    array = tmp_path / "array.json"
    array.write_text(json.dumps([json.loads(suite_file.read_text())]))
    fails(["bench", "--suite", str(array), "--seeds", "0", "--out", out], capsys, str(array),
          "must hold a JSON object of suite fields", "not a list")
    data = json.loads(suite_file.read_text())
    del data["dataset"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(data))
    fails(["train", "--suite", str(missing), "--method", "ncm", "--output-dir", out], capsys, str(missing),
          "missing required field(s) ['dataset']")


def test_a_seed_in_a_suite_is_refused_not_replaced_by_the_run_seed(suite_file, tmp_path, capsys):
    path = derived(tmp_path, suite_file, training={"batch_size": 8, "seed": 3})
    fails(["bench", "--suite", path, "--seeds", "0", "--out", str(tmp_path / "out")], capsys,
          "training.seed", "seeds come from the run seed")


def test_debug_shows_the_traceback(suite_file, tmp_path):
    path = derived(tmp_path, suite_file, training={"epochs": 1.5})
    with pytest.raises(UserInputError, match="training.epochs"):
        main(["--debug", "bench", "--suite", path, "--seeds", "0", "--out", str(tmp_path / "out")])
    # The installed entry point: no traceback, one line, exit code 2 (the flag also works after the command).
    command = [sys.executable, "-c", "import sys; from hf_clroute.cli import main; sys.exit(main())",
               "bench", "--suite", path, "--seeds", "0", "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UserInputError" in debug.stderr


# ---- data: a corrupt image, and fewer examples than the suite asks for -----------------------------------

def _png(value: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes, 6 training and 3 test images each; training row 13 is not an image."""
    from datasets import ClassLabel, Dataset, Features, Image

    root = tmp_path_factory.mktemp("images") / "shapes"
    root.mkdir()
    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b", "c", "d"])})
    for split, per_class in (("train", 6), ("test", 3)):
        images = [{"bytes": _png(10 * i), "path": None} for i in range(4 * per_class)]
        labels = [i % 4 for i in range(4 * per_class)]
        Dataset.from_dict({"image": images, "label": labels}, features=features).to_parquet(root / f"{split}.parquet")
    corrupt = root.parent / "corrupt"
    corrupt.mkdir()
    train = Dataset.from_parquet(str(root / "train.parquet"))
    rows = train.to_dict()
    rows["image"][13] = {"bytes": b"not a png", "path": None}
    Dataset.from_dict(rows, features=features).to_parquet(corrupt / "train.parquet")
    (corrupt / "test.parquet").write_bytes((root / "test.parquet").read_bytes())
    return root


def test_a_corrupt_image_names_the_dataset_split_and_row(suite_file, image_folder, tmp_path, capsys):
    path = derived(tmp_path, suite_file, dataset=str(image_folder.parent / "corrupt"), max_classes=0,
                   train_per_class=None, test_per_class=None)
    fails(["train", "--suite", path, "--method", "ncm", "--output-dir", str(tmp_path / "run")], capsys,
          "dataset 'corrupt'", "split 'train'", "row 13", "cannot be decoded")


def test_more_test_examples_per_class_than_a_split_has_is_refused_or_kept_on_request(suite_file, image_folder,
                                                                                     tmp_path, capsys):
    from hf_clroute.bench.harness.suites import SuiteConfig, build_stream

    fields = {"dataset": str(image_folder), "max_classes": 0, "train_per_class": None, "test_per_class": 5}
    path = derived(tmp_path, suite_file, **fields)
    fails(["train", "--suite", path, "--method", "ncm", "--output-dir", str(tmp_path / "run")], capsys,
          path, "test_per_class is 5", "4 of 4 classes", "(class: count) a: 3, b: 3, c: 3, d: 3",
          "allow_fewer_per_class")
    kept = SuiteConfig.load(derived(tmp_path, suite_file, "kept.json", allow_fewer_per_class=True, **fields))
    assert [len(e.test) for e in build_stream(kept, 0)] == [6, 6]  # every test example there is, said up front


# ---- resume: nothing to resume, a changed suite, a full disk ---------------------------------------------

def train(suite: str, out: Path, *extra: str) -> int:
    return main(["train", "--suite", suite, "--method", "finetune", "--output-dir", str(out), "--no-progress", *extra])


def snapshot(root: Path) -> dict[str, bytes]:
    """Every checkpoint file's bytes, by path: what must survive a refused resume."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(suite_file, tmp_path_factory) -> list[list[float]]:
    out = tmp_path_factory.mktemp("uninterrupted")
    assert train(str(suite_file), out) == 0
    return json.loads((out / "result.json").read_text())["accuracy_matrix"]


def test_resume_before_any_checkpoint_says_so_and_starts_only_when_asked(suite_file, tmp_path, capsys, uninterrupted):
    out = tmp_path / "run"
    fails(["train", "--suite", str(suite_file), "--method", "finetune", "--output-dir", str(out), "--resume"], capsys,
          "--resume: no checkpoint under", "--resume-or-start")
    assert not (out / "checkpoints").exists()
    assert train(str(suite_file), out, "--resume-or-start") == 0
    assert json.loads((out / "result.json").read_text())["accuracy_matrix"] == uninterrupted
    # A second fresh start in the same directory would replace its checkpoints: refused, unless asked for.
    fails(["train", "--suite", str(suite_file), "--method", "finetune", "--output-dir", str(out)], capsys,
          "already holds checkpoints", "--resume", "--restart")
    assert train(str(suite_file), out, "--restart", "--stop-after-steps", "1") == 0
    assert not checkpoint.list_checkpoints(out / "checkpoints")  # the old run's went; none written in 1 step


def test_a_changed_suite_is_refused_before_any_checkpoint_is_touched(suite_file, tmp_path, capsys, uninterrupted):
    out = tmp_path / "run"
    assert train(str(suite_file), out, "--checkpoint-every", "2", "--stop-after-steps", "5") == 0
    before = snapshot(out / "checkpoints")
    assert len(checkpoint.list_checkpoints(out / "checkpoints")) == 2
    edited = derived(tmp_path, suite_file, "tiny.json", test_per_class=6)  # the same name, edited
    fails(["train", "--suite", edited, "--method", "finetune", "--output-dir", str(out), "--resume"], capsys,
          "was written by another run", "suite field 'test_per_class' is 8 there but 6 now")
    resume_args = ["--resume", "--checkpoint-every", "2"]
    with pytest.raises(ResumeError, match="training field 'learning_rate' is 0.001 there but 0.01 now"):
        from hf_clroute.commands.train import load_run_config
        from hf_clroute.commands.train import train as train_run

        config = load_run_config(None, suite=str(suite_file), method="finetune", output_dir=str(out),
                                 training={"learning_rate": 0.01})
        train_run(config, resume="resume")
    assert snapshot(out / "checkpoints") == before  # nothing written, renamed or pruned
    assert train(str(suite_file), out, *resume_args) == 0
    assert json.loads((out / "result.json").read_text())["accuracy_matrix"] == uninterrupted


def test_a_full_disk_while_writing_results_is_one_line_and_loses_no_checkpoint(suite_file, tmp_path, capsys,
                                                                              monkeypatch, uninterrupted):
    out = tmp_path / "run"
    write_text = pathlib.Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith(".result"):  # the temporary file result.json is written through
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(pathlib.Path, "write_text", full_disk)
        fails(["train", "--suite", str(suite_file), "--method", "finetune", "--output-dir", str(out), "--no-progress"],
              capsys, "No space left on device", "the disk is full")
    assert not (out / "result.json").exists() and not list(out.glob(".result*"))  # no half-written file
    assert all(checkpoint.is_complete(p) for p in checkpoint.list_checkpoints(out / "checkpoints"))
    assert train(str(suite_file), out, "--resume") == 0  # the last checkpoint holds the finished run
    assert json.loads((out / "result.json").read_text())["accuracy_matrix"] == uninterrupted


# ---- the last faults a user hit: a full disk mid-checkpoint, damaged or tampered checkpoints, a failing Hub,
# ---- adapter folders other libraries are pointed at, and adapters that must be the same bytes run to run

def fails_with(code: int, argv: list[str], capsys: pytest.CaptureFixture, *expected: str) -> str:
    """Run the CLI, expect exit ``code`` (2: bad input, 3: a Hub failure) and one error line holding every
    ``expected`` part; return it."""
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf-clroute: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    return lines[0]


def resume_args(suite_file: Path, out: Path) -> list[str]:
    return ["train", "--suite", str(suite_file), "--method", "finetune", "--output-dir", str(out), "--no-progress",
            "--resume", "--checkpoint-every", "2"]


@pytest.fixture(scope="module")
def stopped_run(suite_file, tmp_path_factory) -> Path:
    """A run stopped after 7 steps, checkpointed every 2 (two kept): the first task's end (step 4), and step 6
    mid-task, whose Accelerate state holds the optimizer's."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    assert train(str(suite_file), out, "--checkpoint-every", "2", "--stop-after-steps", "7") == 0
    assert [checkpoint.checkpoint_key(p)[0] for p in checkpoint.list_checkpoints(out / "checkpoints")] == [4, 6]
    return out


def copy_run(stopped_run: Path, tmp_path: Path, only: str | None = None) -> Path:
    """A copy of the stopped run's output directory; ``only``: keep just that checkpoint, named by ``latest``."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(stopped_run, out)
    root = out / "checkpoints"
    if only is not None:
        for path in checkpoint.list_checkpoints(root):
            if path.name != only:
                shutil.rmtree(path)
        (root / checkpoint.LATEST).write_text(only + "\n")
    return out


def test_a_full_disk_while_a_checkpoint_is_saved_is_one_line_and_latest_stays_whole(suite_file, tmp_path, capsys,
                                                                                   monkeypatch, uninterrupted):
    import accelerate.checkpointing
    from safetensors import SafetensorError

    from hf_clroute.core import model as model_module

    out, root = tmp_path / "run", tmp_path / "run" / "checkpoints"
    save_file, torch_save = model_module.save_file, accelerate.checkpointing.save

    def full_disk(tensors, filename, metadata=None):  # what safetensors raises when the disk fills
        if ".tmp-ckpt-00000004" in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return save_file(tensors, filename, metadata=metadata)

    def write_failed(obj, path, *args, **kwargs):  # what torch.save raises when the disk fills
        if ".tmp-ckpt-00000004" in str(path):
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0 "
                               "PytorchStreamWriter failed writing file data/0: file write failed")
        return torch_save(obj, path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(accelerate.checkpointing, "save", write_failed)
        fails(["train", "--suite", str(suite_file), "--method", "finetune", "--output-dir", str(out), "--no-progress",
               "--checkpoint-every", "2"], capsys, f"checkpoint {root / 'ckpt-00000004'} was not saved",
              "file write failed", "'latest' still names ckpt-00000002")
    with monkeypatch.context() as patch:
        patch.setattr(model_module, "save_file", full_disk)
        fails(resume_args(suite_file, out), capsys, f"checkpoint {root / 'ckpt-00000004'} was not saved",
              "No space left on device", "the disk is full", "'latest' still names ckpt-00000002")
    assert (root / checkpoint.LATEST).read_text().strip() == "ckpt-00000002"
    assert [p.name for p in checkpoint.list_checkpoints(root)] == ["ckpt-00000002"]
    assert checkpoint.is_complete(root / "ckpt-00000002") and not list(root.glob(".tmp-*"))  # the space is freed
    assert main(resume_args(suite_file, out)) == 0
    assert json.loads((out / "result.json").read_text())["accuracy_matrix"] == uninterrupted


def test_a_truncated_optimizer_state_falls_back_to_the_previous_checkpoint(suite_file, stopped_run, tmp_path, capsys,
                                                                           caplog, uninterrupted):
    import logging

    out = copy_run(stopped_run, tmp_path)
    root = out / "checkpoints"
    latest = root / (root / checkpoint.LATEST).read_text().strip()
    optimizer = latest / "accelerate" / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    assert not checkpoint.is_complete(latest)
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        assert main(resume_args(suite_file, out)) == 0
    said = [r.getMessage() for r in caplog.records if r.name == checkpoint.__name__]
    assert len(said) == 1, said  # said once, though both the resume check and the trainer look
    for part in ("'latest' names 'ckpt-00000006', which is damaged: accelerate/optimizer.bin is 100 bytes",
                 "resuming from ckpt-00000004.1"):
        assert part in said[0], said[0]
    assert json.loads((out / "result.json").read_text())["accuracy_matrix"] == uninterrupted

    # The only checkpoint damaged: one line naming it and the file; nothing written or removed.
    solo = copy_run(stopped_run, tmp_path / "solo", only="ckpt-00000006")
    optimizer = solo / "checkpoints" / "ckpt-00000006" / "accelerate" / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:-10])
    before = snapshot(solo / "checkpoints")
    fails(resume_args(suite_file, solo), capsys, "no complete checkpoint", "ckpt-00000006",
          "accelerate/optimizer.bin")
    assert snapshot(solo / "checkpoints") == before


class _Payload:
    """A pickle that, once loaded with the full unpickler, creates a directory: proof that it ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.makedirs, (self.marker,)


def test_a_malicious_rng_state_is_refused_naming_the_file(suite_file, stopped_run, tmp_path, capsys):
    import torch

    out = copy_run(stopped_run, tmp_path)
    marker = tmp_path / "payload-ran"
    latest = out / "checkpoints" / (out / "checkpoints" / checkpoint.LATEST).read_text().strip()
    rng = latest / "accelerate" / "random_states_0.pkl"
    torch.save({"random_state": _Payload(marker)}, rng)
    before = snapshot(out / "checkpoints")
    line = fails(resume_args(suite_file, out), capsys, str(rng), "not a plain tensor state")
    assert "weights_only" not in line and not marker.exists()  # never advises the unsafe load; never ran it
    assert snapshot(out / "checkpoints") == before


def test_a_hub_answering_500_is_reported_as_the_servers_answer(hub_server, suite_file, capsys, monkeypatch):
    from huggingface_hub.utils import _http

    from hf_clroute.testing.hub_store import HubError as Answer

    for fn in (_http.http_backoff, _http.http_stream_backoff):  # the client retries a 500: no long waits here
        kwdefaults = getattr(fn, "__kwdefaults__", None) or {}
        if {"base_wait_time", "max_wait_time"} <= kwdefaults.keys():
            monkeypatch.setitem(kwdefaults, "base_wait_time", 0.01)
            monkeypatch.setitem(kwdefaults, "max_wait_time", 0.02)

    def broken(method, path):
        raise Answer(500, "the database is down")

    monkeypatch.setattr(hub_server, "route", broken)
    line = fails_with(3, ["evaluate", "--adapter", "tester/x", "--suite", str(suite_file)], capsys,
                      "500", hub_server.url, "adapter 'tester/x'")
    assert "unreachable" not in line


def _vit_without_pooler(path: Path) -> Path:
    """A ViT directory saved without a pooler, as the committed backbones are: each load initialises one afresh."""
    import torch
    from transformers import ViTImageProcessor, ViTModel

    from hf_clroute.backbones.catalog import tiny_vit_config

    torch.manual_seed(0)
    ViTModel(tiny_vit_config(), add_pooling_layer=False).save_pretrained(path)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(path)
    return path


def test_adapter_folders_say_how_to_load_them_and_are_the_same_bytes_run_to_run(tmp_path):
    from transformers import AutoModel

    from hf_clroute import get_cl_model
    from hf_clroute.backbones.catalog import load_backbone
    from hf_clroute.baselines import FinetuneConfig
    from hf_clroute.baselines.lora.config import LoraBaselineConfig

    base = _vit_without_pooler(tmp_path / "vit")
    for name in ("one", "two"):  # the backbone trains: its fresh, unread pooler must not be saved
        model = get_cl_model(load_backbone(str(base))[0], FinetuneConfig())
        model.grow_head(4)
        model.save_pretrained(tmp_path / name)
    assert snapshot(tmp_path / "one") == snapshot(tmp_path / "two")
    lora = get_cl_model(load_backbone(str(base))[0], LoraBaselineConfig(r=2))
    lora.save_pretrained(tmp_path / "lora")
    for name in ("one", "lora"):
        readme = (tmp_path / name / "README.md").read_text()
        assert "hf_clroute adapter" in readme and "AutoCLModel.from_pretrained(" in readme, readme
    with pytest.raises(ValueError, match="model_type"):  # transformers' own error; the README says what to do
        AutoModel.from_pretrained(tmp_path / "one")
    # A LoRA folder is also PEFT's: transformers loads the backbone with the LoRA weights, and no head; said so.
    assert type(AutoModel.from_pretrained(tmp_path / "lora")).__name__ == "ViTModel"
    assert "not this adapter's head and labels" in (tmp_path / "lora" / "README.md").read_text()
    # A model card already there keeps its text and gains the line.
    (tmp_path / "card").mkdir()
    (tmp_path / "card" / "README.md").write_text("# my card\n")
    model.save_pretrained(tmp_path / "card")
    card = (tmp_path / "card" / "README.md").read_text()
    assert card.startswith("# my card\n") and card.count("AutoCLModel.from_pretrained(") == 1


def test_a_flipped_bit_in_a_peft_file_is_reported_against_that_file(tmp_path):
    from hf_clroute import get_cl_model
    from hf_clroute.backbones.catalog import load_backbone
    from hf_clroute.baselines.lora.config import LoraBaselineConfig
    from hf_clroute.core.model import PEFT_WEIGHTS_NAME, WEIGHTS_NAME, CLModel

    base = str(_vit_without_pooler(tmp_path / "vit"))
    get_cl_model(load_backbone(base)[0], LoraBaselineConfig(r=2)).save_pretrained(tmp_path / "lora")
    peft_file = tmp_path / "lora" / PEFT_WEIGHTS_NAME
    data = bytearray(peft_file.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor
    peft_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{PEFT_WEIGHTS_NAME}: tensor checksum does not match") as raised:
        CLModel.from_pretrained(load_backbone(base)[0], tmp_path / "lora")
    assert WEIGHTS_NAME not in str(raised.value)


def test_push_says_a_method_name_is_invalid(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "adapters" / "finetune").mkdir(parents=True)
    (run / "results.json").write_text("{}")
    fails(["push", str(run), "--repo-id", "me/x", "--method", "../../x"], capsys,
          "--method '../../x' is not a method name", "['finetune']")
    fails(["push", str(run), "--repo-id", "me/x", "--method", "ncm"], capsys,
          "--method 'ncm'", "holds no adapter of that method", "['finetune']")
