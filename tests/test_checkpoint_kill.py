"""No kill loses a checkpoint: a run killed at any step of writing, replacing or removing a checkpoint
resumes to the uninterrupted run's numbers, and a `latest` that names nothing complete falls back to
the newest complete checkpoint, saying which."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from accelerate import Accelerator
from test_engine import collator, tiny_backbone

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.baselines import FinetuneConfig
from hf_clroute.core.model import CLModel
from hf_clroute.data import class_incremental, load_source
from hf_clroute.engine import checkpoint, make_accelerator
from hf_clroute.errors import ResumeError

# 40 training examples per task, batch 8: 5 steps a task. A checkpoint every 5 steps falls on each
# task's last step, so the task-end checkpoint that follows is a second one at the same step: the
# replacement a kill used to break. Keeping one checkpoint also prunes the older step's.
RUN = {"checkpoint_every": 5, "keep_checkpoints": 1}


@pytest.fixture(scope="module")
def stream():
    return class_incremental(
        load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=20, test_per_class=10,
        name="mnist",
    )


def fit(stream, resume_from=None, **training):
    config = TrainingConfig(**{"batch_size": 8, "learning_rate": 1e-3, "progress": False, **training})
    model = get_cl_model(tiny_backbone(), FinetuneConfig())
    return ContinualTrainer(model, stream, config, collator(), make_accelerator(config, cpu=True)).fit(resume_from)


@pytest.fixture(scope="module")
def uninterrupted(stream):
    return fit(stream)


class Killed(BaseException):
    """What a kill -9 leaves: nothing after this point runs (not even ``except Exception``)."""


class Operations:
    """Counts the filesystem operations of checkpointing; ``kill_at`` (1-based) raises :class:`Killed`
    before that operation, or, for a directory removal with ``partial``, after deleting part of it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kill_at: int = 0, partial: bool = False) -> None:
        self.count, self.kill_at, self.partial, self.names = 0, kill_at, partial, []
        for owner, name in ((checkpoint, "_replace"), (checkpoint, "_remove_tree"), (checkpoint, "atomic_write_text"),
                            (Accelerator, "save_state"), (CLModel, "save_pretrained")):
            monkeypatch.setattr(owner, name, self._wrap(name, getattr(owner, name)))

    def _wrap(self, name, operation):
        def counted(*args, **kwargs):
            self.count += 1
            self.names.append(name)
            if self.count == self.kill_at:
                if self.partial and name == "_remove_tree":
                    files = sorted(p for p in args[0].rglob("*") if p.is_file())
                    for path in files[: len(files) // 2]:
                        path.unlink()
                raise Killed(f"killed before {name} (operation {self.count})")
            return operation(*args, **kwargs)
        return counted


def test_a_kill_at_any_step_of_checkpointing_resumes_to_the_same_numbers(stream, uninterrupted, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        ops = Operations(patch)
        fit(stream, checkpoint_dir=str(tmp_path / "count"), **RUN)
    # Two checkpoints at step 5, two at step 10: the second of each replaces the first; step 10 prunes step 5.
    assert ops.names.count("_remove_tree") == 3 and ops.names.count("_replace") == 7
    removals = [i + 1 for i, name in enumerate(ops.names) if name == "_remove_tree"]
    kills = [(k, False) for k in range(1, ops.count + 1)] + [(k, True) for k in removals]
    for k, partial in kills:
        root = tmp_path / f"kill-{k}{'-partial' if partial else ''}"
        with monkeypatch.context() as patch:
            Operations(patch, kill_at=k, partial=partial)
            with pytest.raises(Killed):
                fit(stream, checkpoint_dir=str(root), **RUN)
        if not checkpoint.list_checkpoints(root):
            continue  # killed before the first checkpoint was complete: a fresh start, nothing to resume
        resumed = fit(stream, checkpoint_dir=str(root), resume_from=root, **RUN)
        assert resumed.finished, f"kill at operation {k} ({ops.names[k - 1]})"
        assert resumed.accuracy_matrix == uninterrupted.accuracy_matrix, f"kill at operation {k} ({ops.names[k - 1]})"
        assert all(checkpoint.is_complete(p) for p in checkpoint.list_checkpoints(root))


def test_a_dangling_or_incomplete_latest_falls_back_to_the_newest_complete_checkpoint(stream, uninterrupted, tmp_path,
                                                                                     caplog):
    root = tmp_path / "ckpt"
    fit(stream, checkpoint_dir=str(root), stop_after_steps=7, checkpoint_every=3, keep_checkpoints=0)
    names = [p.name for p in checkpoint.list_checkpoints(root)]
    assert names == ["ckpt-00000003", "ckpt-00000005", "ckpt-00000006"]

    # `latest` names a checkpoint that is gone (what the old replace-in-place left after a kill).
    shutil.rmtree(root / "ckpt-00000006")
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        assert checkpoint.find_checkpoint(root) == root / "ckpt-00000005"
    assert "'latest' names 'ckpt-00000006', which is missing or incomplete; resuming from ckpt-00000005" in caplog.text
    resumed = fit(stream, checkpoint_dir=str(tmp_path / "out"), resume_from=root)
    assert resumed.accuracy_matrix == uninterrupted.accuracy_matrix

    # `latest` names a directory with its loop state gone; and no `latest` at all.
    (root / "ckpt-00000005" / checkpoint.STATE_NAME).unlink()
    assert checkpoint.find_checkpoint(root) == root / "ckpt-00000003"
    (root / checkpoint.LATEST).unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        assert checkpoint.find_checkpoint(root) == root / "ckpt-00000003"
    assert "there is no 'latest' file; resuming from ckpt-00000003" in caplog.text

    shutil.rmtree(root / "ckpt-00000003")
    with pytest.raises(ResumeError, match=r"no complete checkpoint under .*ckpt-00000005"):
        checkpoint.find_checkpoint(root)
    with pytest.raises(ResumeError, match="no checkpoint at"):
        checkpoint.find_checkpoint(tmp_path / "nothing")


def test_a_second_checkpoint_at_a_step_takes_a_new_name(stream, tmp_path):
    root = tmp_path / "ckpt"
    fit(stream, checkpoint_dir=str(root), checkpoint_every=5, keep_checkpoints=0)
    # Each task's last step is checkpointed twice (mid-task, then at the task end): the second is a new
    # directory and the first is removed only after `latest` moved.
    assert [p.name for p in checkpoint.list_checkpoints(root)] == ["ckpt-00000005.1", "ckpt-00000010.1"]
    assert (root / checkpoint.LATEST).read_text().strip() == "ckpt-00000010.1"
    assert checkpoint.read_state(root / "ckpt-00000010.1")["next_task"] == 2
    assert not list(root.glob(".t*"))  # no temporary or half-removed directory left


def test_a_checkpoint_reaches_the_disk_before_it_becomes_one(stream, tmp_path, monkeypatch):
    """Every file of a checkpoint and its directories are fsynced before the rename that makes it one, and
    the root after the rename and after `latest` moves: a power cut cannot leave `latest` naming a
    directory whose files never reached the disk."""
    events, fsync, replace = [], checkpoint._fsync, checkpoint._replace

    def synced(path):
        events.append(("fsync", Path(path), None))
        fsync(path)

    def replaced(src, dst):  # what the directory holds at the moment it is renamed
        events.append(("replace", Path(src), {src, *Path(src).rglob("*")}))
        replace(src, dst)

    monkeypatch.setattr(checkpoint, "_fsync", synced)
    monkeypatch.setattr(checkpoint, "_replace", replaced)
    root = tmp_path / "ckpt"
    fit(stream, checkpoint_dir=str(root), **RUN)
    commits = [i for i, (kind, path, _) in enumerate(events) if kind == "replace" and path.name.startswith(".tmp-ckpt")]
    assert len(commits) == 4  # each task's mid-task checkpoint (its last step) and its task end's
    for i in commits:
        contents = events[i][2]
        assert len(contents) > 5 and contents <= {path for kind, path, _ in events[:i] if kind == "fsync"}
        after = [path for kind, path, _ in events[i + 1:i + 4] if kind == "fsync"]
        assert after == [root, root / checkpoint.LATEST, root]


def test_a_rank_state_missing_from_the_checkpoint_is_refused(stream, tmp_path, monkeypatch):
    """On several machines without a shared filesystem a rank's RNG state lands on its own disk: the
    main process refuses to commit a checkpoint without it, naming the need for a shared filesystem."""
    from hf_clroute.errors import UserInputError

    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: 2))
    root = tmp_path / "ckpt"
    with pytest.raises(UserInputError, match=r"process\(es\) \[1\].*filesystem every machine shares"):
        fit(stream, checkpoint_dir=str(root), **RUN)
    assert not checkpoint.list_checkpoints(root) and not (root / checkpoint.LATEST).exists()
