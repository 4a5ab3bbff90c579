"""Checkpoints a stopped run resumes from, ending with the same accuracy matrix.

``<dir>/ckpt-<step>/`` holds Accelerate's ``save_state`` (optimizer, RNG), the adapter, a small JSON of loop
state and ``checkpoint_files.json`` (every file's size and sha256); ``<dir>/latest`` names the newest.
No kill at any moment loses the last complete checkpoint:

* a checkpoint is written under a temporary name and renamed into place whole, so a ``ckpt-*``
  directory is always complete; one that cannot be written (a full disk) is removed and the run stops
  with an ``OSError`` naming it, ``latest`` still naming the last complete one;
* a checkpoint never replaces one of the same name: a second one at the same step (the task-end
  checkpoint after a ``checkpoint_every`` one) gets the next free name (``ckpt-<step>.1``...);
  ``latest`` moves to it, and only then is the old one removed;
* a checkpoint is removed by renaming it out of the ``ckpt-*`` names first, so a half-deleted
  directory never looks like a checkpoint.

``find_checkpoint`` checks the checkpoint it picks: its files against their recorded sizes and sha256, its
pickles read with the tensors-only unpickler. When ``latest`` names nothing complete (gone, truncated,
altered) it resumes from the newest complete checkpoint and says which, once; a pickle asking for
more than tensor state is refused, naming the file (its payload never runs).

A commit is durable: every file and directory of the new checkpoint is fsynced before the rename, and
the root after it and after ``latest`` moves. Every process writes its own RNG state into the directory
the main process commits, so on several machines it must be a filesystem they share (NFS, Lustre);
``save_checkpoint`` refuses to commit a checkpoint missing a rank.

A resumed run must be the run that wrote the checkpoint: :func:`check_resume` compares the suite and
the settings recorded in it (``run_fingerprint``) before anything is loaded or written, and refuses a
changed one with a :class:`~hf_clroute.errors.ResumeError` naming the field.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_clroute.errors import ResumeError, UserInputError
from hf_clroute.hub.io import atomic_path, atomic_write_text, sha256_file

if TYPE_CHECKING:  # pragma: no cover
    from accelerate import Accelerator

    from hf_clroute.core.model import CLModel

STATE_NAME = "trainer_state.json"
LATEST = "latest"
#: every file of a checkpoint with its size and sha256, as written
MANIFEST_NAME = "checkpoint_files.json"
#: files Accelerate writes with ``torch.save`` (pickles): read with the tensors-only unpickler before a resume
_PICKLED = (".bin", ".pkl", ".pt", ".pth")
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
    """Whether ``path`` holds everything a resume reads (loop state, adapter and Accelerate state), each
    file of the size recorded when it was written. :func:`checkpoint_problem` also reads them."""
    return _missing_part(path) is None and _size_problem(path, _read_manifest(path)) is None


def _missing_part(path: Path) -> str | None:
    if not (path / STATE_NAME).is_file():
        return f"lacks {STATE_NAME}"
    if not (path / "accelerate").is_dir():
        return "lacks accelerate/"
    if not any((path / "adapter" / name).is_file() for name in ADAPTER_CONFIG_NAMES):
        return "lacks adapter/"
    return None


def _read_manifest(path: Path) -> dict[str, dict[str, Any]] | str | None:
    """The recorded files (relative path -> bytes, sha256); None for a checkpoint written before
    manifests; a string saying why when the manifest itself is damaged."""
    file = path / MANIFEST_NAME
    if not file.is_file():
        return None
    try:
        files = json.loads(file.read_text())["files"]
        return {str(k): {"bytes": int(v["bytes"]), "sha256": str(v["sha256"])} for k, v in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as err:
        return f"{MANIFEST_NAME} cannot be read ({type(err).__name__})"


def _size_problem(path: Path, manifest: dict[str, dict[str, Any]] | str | None) -> str | None:
    if isinstance(manifest, str):
        return manifest
    for name, record in (manifest or {}).items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != record["bytes"]:
            return f"{name} is {size} bytes, {record['bytes']} were written"
    return None


def _write_manifest(directory: Path) -> None:
    """Record every file under ``directory`` (its size and sha256) in :data:`MANIFEST_NAME`."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)
    record = {p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
    with atomic_path(directory / MANIFEST_NAME) as tmp:
        tmp.write_text(json.dumps({"files": record}, indent=1, sort_keys=True) + "\n")


def _unsafe_global(err: BaseException) -> str | None:
    """The forbidden global a tensors-only load refused (``os.system``...), or ``"?"``; None for other errors."""
    text = str(err)
    if not isinstance(err, pickle.UnpicklingError) or "Weights only load failed" not in text:
        return None
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return found.group(1)
    return "?" if re.search(r"unsupported (operand|class|global)", text, re.IGNORECASE) else None


def _read_pickle(path: Path, file: Path) -> str | None:
    """Read ``file`` as Accelerate will, with the tensors-only unpickler (its payload never runs); why it
    cannot be read, or None. A pickle that asks for anything but tensor state is refused outright."""
    from accelerate.utils import load

    name = file.relative_to(path).as_posix()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on pickle protocols
        try:
            try:
                load(file, map_location="cpu", mmap=True)  # reads the tensors' bytes lazily
            except RuntimeError as err:
                if "mmap" not in str(err):
                    raise
                load(file, map_location="cpu")  # an old-style pickle: no mmap
        except Exception as err:  # noqa: BLE001 - every way a file can fail to load is a damaged checkpoint
            forbidden = _unsafe_global(err)
            if forbidden is not None:
                what = f" (it asks for {forbidden})" if forbidden != "?" else ""
                raise ResumeError(
                    f"checkpoint file {file} is not a plain tensor state{what}: it was not loaded, and should not be. "
                    f"This package never writes such a file: it was altered after {path.name} was saved. Delete "
                    f"{path} to resume from the checkpoint before it") from None
            text = (str(err).strip().splitlines() or [type(err).__name__])[0]
            return f"{name} cannot be read ({type(err).__name__}: {text[:160]})"
    return None


#: (checkpoint directory, its files' names, sizes and times) -> the verdict of :func:`checkpoint_problem`
_VERIFIED: dict[tuple[str, tuple], str | None] = {}


def checkpoint_problem(path: Path) -> str | None:
    """Why a resume cannot read the checkpoint at ``path``, or None: a part is missing, a file differs
    in size or sha256 from what was written, or a pickle cannot be read with the tensors-only
    unpickler. Raises :class:`ResumeError` naming a pickle that asks for more than tensor state."""
    path = Path(path)
    missing = _missing_part(path)
    if missing is not None:
        return missing
    files = sorted(p for p in path.rglob("*") if p.is_file())
    key = (str(path.resolve()), tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key in _VERIFIED:
        return _VERIFIED[key]
    manifest = _read_manifest(path)
    pickles = sorted(p for p in (path / "accelerate").rglob("*") if p.is_file() and p.suffix in _PICKLED)
    unreadable = [problem for problem in map(lambda file: _read_pickle(path, file), pickles) if problem]
    problem = _size_problem(path, manifest) or next(iter(unreadable), None)  # a size says more than an error
    if problem is None and isinstance(manifest, dict):
        problem = next((f"{name} differs from the file written (sha256)" for name, record in manifest.items()
                        if sha256_file(path / name) != record["sha256"]), None)
    _VERIFIED[key] = problem
    return problem


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
    try:
        accelerator.save_state(str(tmp / "accelerate"))
        # Every rank writes its own RNG file: wait for all before the directory is renamed.
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            missing = [i for i in range(accelerator.num_processes)
                       if not (tmp / "accelerate" / f"random_states_{i}.pkl").is_file()]
            if missing:
                raise UserInputError(f"checkpoint {tmp}: the RNG state of process(es) {missing} is not there; a "
                                     "multi-node run needs its checkpoint directory on a filesystem every machine "
                                     "shares")
            model.save_pretrained(tmp / "adapter")
            atomic_write_text(tmp / STATE_NAME, json.dumps(state, sort_keys=True))
            _write_manifest(tmp)
            _fsync_tree(tmp)  # the files reach the disk before the rename makes them a checkpoint
    except Exception as err:
        write_error = _write_failure(err, root, final)
        if accelerator.is_main_process and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # what was written of it: the space back, nothing half-kept
        if write_error is None:
            raise
        raise write_error from err
    if accelerator.is_main_process:
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


def _write_failure(err: BaseException, root: Path, final: Path) -> OSError | None:
    """An ``OSError`` naming the checkpoint and what ``latest`` still names, for an error a failed write
    raises (a full disk: ``OSError``, safetensors' ``SafetensorError``, torch's "file write failed");
    None for any other error."""
    from safetensors import SafetensorError

    own = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    text = " ".join(f"{own}{f': {err.filename}' if getattr(err, 'filename', None) else ''}".split())
    code = getattr(err, "errno", None) if isinstance(err, OSError) else None
    if code is None and ("No space left" in text or "os error 28" in text):
        code = errno.ENOSPC
    if not isinstance(err, (OSError, SafetensorError)) and not (
            isinstance(err, RuntimeError) and re.search(r"write failed|failed writing|No space left", text)):
        return None
    if code is None:  # torch does not say why a write failed: a disk with no room left is the usual cause
        try:
            code = errno.ENOSPC if shutil.disk_usage(root).free < (1 << 20) else errno.EIO
        except OSError:
            code = errno.EIO
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    kept = f"'{LATEST}' still names {latest}" if latest else "no earlier checkpoint was kept"
    reason = text.split("] . ")[-1] if text.startswith("[enforce fail") else text
    return OSError(code, f"checkpoint {final} was not saved ({reason}); {kept}")


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

    When ``latest`` is missing or names a directory that is gone, incomplete or damaged
    (:func:`checkpoint_problem`), the newest checkpoint under the root that is whole is used, with one
    warning naming both. A pickle that is not a plain tensor state is refused (:class:`ResumeError`).
    """
    path = Path(resume_from)
    if (path / STATE_NAME).is_file():
        problem = checkpoint_problem(path)
        if problem is not None:
            raise ResumeError(f"checkpoint {path} cannot be resumed from: {problem}; resume from its checkpoint "
                              f"root {path.parent} to fall back to an earlier one")
        return path
    candidates = list_checkpoints(path) if path.is_dir() else []
    if not (path / LATEST).is_file() and not candidates:
        raise ResumeError(f"no checkpoint at {resume_from} to resume from (expected {STATE_NAME} or a '{LATEST}' "
                          "pointer): the run has not written one yet")
    named = (path / LATEST).read_text().strip() if (path / LATEST).is_file() else None
    order = ([path / named] if named and (path / named).is_dir() else []) + candidates[::-1]
    problems: dict[str, str] = {}
    for candidate in dict.fromkeys(order):
        problem = checkpoint_problem(candidate)
        if problem is None:
            break
        problems[candidate.name] = problem
    else:
        found = "; ".join(f"{name} {problem}" for name, problem in problems.items()) or "there are none"
        raise ResumeError(f"no complete checkpoint under {resume_from} ('{LATEST}' names {named!r}): {found}")
    if candidate.name == named:
        return candidate
    if not named:
        why = f"there is no '{LATEST}' file"
    elif named in problems and not _missing_part(path / named):
        why = f"'{LATEST}' names {named!r}, which is damaged: {problems[named]}"
    else:
        why = f"'{LATEST}' names {named!r}, which is missing or incomplete"
    skipped = "; ".join(f"{n} {problem}" for n, problem in problems.items() if n != named)
    message = (f"checkpoint root {resume_from}: {why}; resuming from {candidate.name}, the newest complete checkpoint"
               + (f" ({skipped})" if skipped else ""))
    if message not in _SAID:  # the resume check and the trainer both look: said once
        _SAID.add(message)
        _logger.warning(message)
    return candidate


#: fall-back warnings already given by this process
_SAID: set[str] = set()


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
