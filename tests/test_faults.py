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
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf-clroute: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    return lines[0]


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
    fails(["bench", "--suite", five, "--seeds", "0", "--out", out], capsys, five, "n_tasks must be an integer, got 'five'")
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
