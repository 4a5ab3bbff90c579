"""Checkpoints a stopped run resumes from, ending with the same accuracy matrix.

``<dir>/ckpt-<step>/`` holds Accelerate's ``save_state`` (optimizer, RNG), the adapter and a small JSON
of loop state; ``<dir>/latest`` names the newest. No kill at any moment loses the last complete checkpoint:

* a checkpoint is written under a temporary name and renamed into place whole,
  so a ``ckpt-*`` directory is always complete;
* a checkpoint never replaces one of the same name: a second one at the same step
  (the task-end checkpoint after a ``checkpoint_every`` one) gets the next free
  name (``ckpt-<step>.1``...); ``latest`` moves to it, and only then is the old one removed;
* a checkpoint is removed by renaming it out of the ``ckpt-*`` names first, so a
  half-deleted directory never looks like a checkpoint.

``find_checkpoint`` on a root whose ``latest`` names nothing complete (a run killed by an older
version of this code, a directory removed by hand) resumes from the newest complete checkpoint
and says which.

A commit is durable: every file of the new checkpoint and its directory are fsynced before the
rename, and the root directory after it and after ``latest`` moves, so a power cut cannot leave
``latest`` naming a directory whose files never reached the disk.

Every process writes its own RNG state into the checkpoint directory the main process then commits,
so the checkpoint directory must be one filesystem every machine shares (NFS, Lustre, a cloud
filesystem): on a multi-node run without one, a rank's state would land on its own disk, and
``save_checkpoint`` refuses to commit a checkpoint missing a rank.

A resumed run must be the run that wrote the checkpoint: :func:`check_resume` compares the suite and
the settings recorded in it (``run_fingerprint``) before anything is loaded or written, and refuses a
changed one with a :class:`~hf_clroute.errors.ResumeError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_clroute.errors import ResumeError, UserInputError
from hf_clroute.hub.io import atomic_write_text

if TYPE_CHECKING:  # pragma: no cover
    from accelerate import Accelerator

    from hf_clroute.core.model import CLModel

STATE_NAME = "trainer_state.json"
LATEST = "latest"
_NAME = re.compile(r"ckpt-(\d+)(?:\.(\d+))?")
_logger = logging.getLogger(__name__)


def _replace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` in one step (the filesystem operations are named so a test can
    interrupt a checkpoint between any two of them)."""
    os.replace(src, dst)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path)


def _fsync(path: Path) -> None:
    """Flush a file or a directory (its entries: a rename, a new file) to the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Every file under ``root``, then every directory, deepest first, then ``root`` itself."""
    paths = sorted(root.rglob("*"), key=lambda p: (p.is_dir(), -len(p.parts)))
    for path in paths + [root]:
        _fsync(path)


def checkpoint_key(path: Path) -> tuple[int, int] | None:
    """(step, revision) of a ``ckpt-<step>[.<revision>]`` name, the order checkpoints were written in;
    None for any other name."""
    match = _NAME.fullmatch(path.name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def list_checkpoints(root: Path) -> list[Path]:
    """The checkpoint directories under ``root``, oldest first."""
    found = [p for p in root.glob("ckpt-*") if p.is_dir() and checkpoint_key(p) is not None]
    return sorted(found, key=checkpoint_key)


#: an adapter directory's config file: ours, or PEFT's beside ours (either marks a saved adapter)
ADAPTER_CONFIG_NAMES = ("adapter_config.json", "hf_clroute_config.json")


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds everything a resume reads: loop state, adapter and Accelerate state."""
    return ((path / STATE_NAME).is_file() and (path / "accelerate").is_dir()
            and any((path / "adapter" / name).is_file() for name in ADAPTER_CONFIG_NAMES))


def _free_name(root: Path, step: int) -> Path:
    """``ckpt-<step>``, or the next revision after the newest checkpoint already at that step."""
    revisions = [checkpoint_key(p)[1] for p in list_checkpoints(root) if checkpoint_key(p)[0] == step]
    name = f"ckpt-{step:08d}" + (f".{max(revisions) + 1}" if revisions else "")
    return root / name


def save_checkpoint(root: Path, step: int, accelerator: "Accelerator", model: "CLModel", state: dict[str, Any],
                    keep: int = 0) -> Path:
    """Write a checkpoint at ``step`` (every process takes part) and point ``latest`` at it."""
    root = Path(root)
    # Every process names it before any is renamed (all see the same directory).
    final = _free_name(root, step)
    tmp = root / f".tmp-ckpt-{step:08d}"
    if accelerator.is_main_process:
        if tmp.exists():
            _remove_tree(tmp)
        # Every process writes its RNG state into this directory: it must exist
        # before the barrier, or a fast rank races the main process creating it.
        (tmp / "accelerate").mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerate"))
    # Every rank writes its own RNG file: wait for all before the directory is renamed.
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        missing = [i for i in range(accelerator.num_processes)
                   if not (tmp / "accelerate" / f"random_states_{i}.pkl").is_file()]
        if missing:
            raise UserInputError(f"checkpoint {tmp}: the RNG state of process(es) {missing} is not there; a multi-node "
                              "run needs its checkpoint directory on a filesystem every machine shares")
        model.save_pretrained(tmp / "adapter")
        atomic_write_text(tmp / STATE_NAME, json.dumps(state, sort_keys=True))
        _fsync_tree(tmp)  # the files reach the disk before the rename makes them a checkpoint
        _replace(tmp, final)
        _fsync(root)
        atomic_write_text(root / LATEST, final.name + "\n")
        _fsync(root / LATEST)
        _fsync(root)
        # Only now that ``latest`` names the new one: the older ones at this step go.
        for older in list_checkpoints(root):
            if checkpoint_key(older)[0] == step and older != final:
                remove_checkpoint(older)
        if keep:
            prune_checkpoints(root, keep)
    accelerator.wait_for_everyone()
    return final


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint: renamed out of the ``ckpt-*`` names first, so a kill mid-delete leaves
    no partial directory that looks like a checkpoint (the leftover goes at the next prune)."""
    trash = path.with_name(f".trash-{path.name}")
    if trash.exists():
        _remove_tree(trash)
    _replace(path, trash)
    _remove_tree(trash)


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never the one ``latest`` names), and what a
    kill left half-deleted."""
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    removed = [p for p in list_checkpoints(root)[:-keep] if p.name != latest]
    for path in removed:
        remove_checkpoint(path)
    for leftover in root.glob(".trash-ckpt-*"):
        _remove_tree(leftover)
    return removed


def remove_checkpoints(root: Path) -> None:
    """Every checkpoint under ``root`` and its ``latest`` (a run restarted from scratch by request)."""
    if (root / LATEST).is_file():
        (root / LATEST).unlink()
    for path in list_checkpoints(root):
        remove_checkpoint(path)
    for leftover in root.glob(".trash-ckpt-*"):
        _remove_tree(leftover)


def find_checkpoint(resume_from: str | Path) -> Path:
    """A checkpoint directory, or the one a checkpoint root's ``latest`` names.

    When ``latest`` is missing or names a directory that is gone or incomplete, the newest
    complete checkpoint under the root is used, with a warning naming it.
    """
    path = Path(resume_from)
    if (path / STATE_NAME).is_file():
        return path
    candidates = list_checkpoints(path) if path.is_dir() else []
    if not (path / LATEST).is_file() and not candidates:
        raise ResumeError(f"no checkpoint at {resume_from} to resume from (expected {STATE_NAME} or a '{LATEST}' "
                          "pointer): the run has not written one yet")
    named = (path / LATEST).read_text().strip() if (path / LATEST).is_file() else None
    if named and is_complete(path / named):
        return path / named
    complete = [p for p in candidates if is_complete(p)]
    if not complete:
        raise ResumeError(
            f"no complete checkpoint under {resume_from}: '{LATEST}' names {named!r} and the directories there "
            f"({', '.join(p.name for p in candidates) or 'none'}) lack {STATE_NAME}, adapter/ or accelerate/"
        )
    why = f"'{LATEST}' names {named!r}, which is missing or incomplete" if named else f"there is no '{LATEST}' file"
    _logger.warning("checkpoint root %s: %s; resuming from %s, the newest complete checkpoint",
                    resume_from, why, complete[-1].name)
    return complete[-1]


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_NAME).read_text())


#: training fields that do not change what a run computes (where and how often it is saved, how
#: it reads data, how it shows progress): a resume may change them, e.g. to stop later
RESUMABLE_CHANGES = ("checkpoint_dir", "checkpoint_every", "keep_checkpoints", "stop_after_steps", "progress",
                     "log_with", "num_workers", "prefetch_factor", "pin_memory", "eval_cache_examples",
                     "eval_cache_mb")


def run_fingerprint(suite: dict[str, Any], training: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint records of its run: the suite's measured fields and the training settings that
    change results, and a short hash of both (the adapter config is recorded beside it by the trainer)."""
    training = {k: v for k, v in sorted(training.items()) if k not in RESUMABLE_CHANGES}
    record = {"suite": dict(sorted(suite.items())), "training": training}
    digest = hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"sha256": digest, **record}


def check_resume(resume_from: str | Path, fingerprint: dict[str, Any]) -> Path:
    """The checkpoint a resume would read, refused (:class:`ResumeError`, before anything is loaded or
    written) when it is missing or was written for another suite or other settings; names the field."""
    path = find_checkpoint(resume_from)
    stored = read_state(path).get("run", {}).get("fingerprint")
    if stored is None or stored.get("sha256") == fingerprint["sha256"]:
        return path  # a checkpoint from before fingerprints: the trainer still checks method, seed and config
    for part in ("suite", "training"):
        old, new = stored.get(part, {}), fingerprint[part]
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if changed:
            name = changed[0]
            raise ResumeError(
                f"checkpoint {path} was written by another run: {part} field {name!r} is {old.get(name)!r} there but "
                f"{new.get(name)!r} now{f' (and {len(changed) - 1} more changed)' if len(changed) > 1 else ''}; "
                "resume with the suite and settings it was started with, or start a new run in another directory")
    raise ResumeError(f"checkpoint {path} was written by another run (fingerprint {stored.get('sha256')} there, "
                      f"{fingerprint['sha256']} now)")
