"""Small file helpers: atomic writes and "local dir or Hub id" resolution.

Every file we write goes to a temporary name in the same directory and is then
renamed over the target: a crash or a full disk never leaves a half-written
checkpoint where a good one used to be.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def resolve_pretrained_dir(path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> Path:
    """A local directory as is; anything else is treated as a Hub repo id and downloaded.

    Only safetensors/JSON/Markdown/PNG files are fetched: we never download pickles.
    """
    path = Path(path_or_repo_id)
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path_or_repo_id} is a file; expected an adapter directory or a Hub repo id")
    from huggingface_hub import snapshot_download

    local = snapshot_download(
        str(path_or_repo_id),
        allow_patterns=["*.json", "*.safetensors", "*.md", "*.png"],
        **hub_kwargs,
    )
    return Path(local)


def refuse_pickles(directory: Path, expected: str) -> None:
    """Raise when a directory holds pickle weights instead of the safetensors we expect."""
    if (directory / expected).is_file():
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{directory} holds pickle file(s) {pickles} but no {expected}; hf_clroute refuses to "
            "load pickles (they can run arbitrary code). Convert the weights to safetensors."
        )
    raise FileNotFoundError(f"no {expected} in {directory}")
