"""Checkpoints a stopped run resumes from, ending with the same accuracy matrix.

``<dir>/ckpt-<step>/`` holds Accelerate's ``save_state`` (optimizer, RNG), the
adapter and a small JSON of loop state; ``<dir>/latest`` names the newest. A
checkpoint is written to a temporary name and renamed, so ``latest`` always
points at a complete one; older ones beyond ``keep`` are deleted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..io import atomic_write_text

if TYPE_CHECKING:  # pragma: no cover
    from accelerate import Accelerator

    from ..model import CLModel

STATE_NAME = "trainer_state.json"
LATEST = "latest"


def save_checkpoint(root: Path, step: int, accelerator: "Accelerator", model: "CLModel", state: dict[str, Any],
                    keep: int = 0) -> Path:
    """Write ``ckpt-<step>`` (every process takes part) and point ``latest`` at it."""
    final = root / f"ckpt-{step:08d}"
    tmp = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        # Every process writes its RNG state into this directory: it must exist
        # before the barrier, or a fast rank races the main process creating it.
        (tmp / "accelerate").mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerate"))
    # Every rank writes its own RNG file: wait for all before the directory is renamed.
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        model.save_pretrained(tmp / "adapter")
        atomic_write_text(tmp / STATE_NAME, json.dumps(state, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        atomic_write_text(root / LATEST, final.name + "\n")
        if keep:
            prune_checkpoints(root, keep)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never the one ``latest`` names)."""
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    checkpoints = sorted(p for p in root.glob("ckpt-*") if p.is_dir())
    removed = [p for p in checkpoints[:-keep] if p.name != latest]
    for path in removed:
        shutil.rmtree(path)
    return removed


def find_checkpoint(resume_from: str | Path) -> Path:
    """A checkpoint directory, or the one a checkpoint root's ``latest`` names."""
    path = Path(resume_from)
    if path.is_dir() and (path / LATEST).is_file():
        path = path / (path / LATEST).read_text().strip()
    if not (path / STATE_NAME).is_file():
        raise FileNotFoundError(f"no checkpoint at {resume_from} (expected {STATE_NAME} or a '{LATEST}' pointer)")
    return path


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_NAME).read_text())
