"""Small file helpers: atomic writes, "local dir or Hub id" resolution, pushing a folder.

Every file we write goes to a temporary name in the same directory and is then
renamed over the target: a crash or a full disk never leaves a half-written
checkpoint where a good one used to be. A push first writes everything to a
temporary directory and uploads that in one commit, so a failed push leaves the
caller's files exactly as they were and the remote repo at its previous commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from .model import CLModel

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
        # mkstemp makes the file private (0600); the result gets the mode a plain open() would give.
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def current_umask() -> int:
    """The process umask (read from /proc where there is one: setting it to read it is racy)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def resolve_pretrained_dir(path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> Path:
    """A local directory as is; anything else is treated as a Hub repo id and downloaded.

    Only safetensors/JSON/Markdown/PNG files are fetched: we never download pickles.
    """
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path_or_repo_id} is a file; expected an adapter directory or a Hub repo id")
    if looks_local(str(path_or_repo_id)):
        raise FileNotFoundError(f"no adapter directory at {path_or_repo_id}")
    from huggingface_hub import snapshot_download

    local = snapshot_download(
        str(path_or_repo_id),
        allow_patterns=["*.json", "*.safetensors", "*.md", "*.png"],
        **hub_kwargs,
    )
    return Path(local)


def looks_local(text: str) -> bool:
    """Whether a name that is not a directory was meant as a local path, not a Hub repo id:
    it starts with ``./``, ``../``, ``/`` or ``~``, has more than one ``/`` (a repo id has one),
    or its parent directory exists here (``runs/typo`` beside an existing ``runs/``)."""
    if text.startswith(("./", "../", "/", "~", "." + os.sep, ".." + os.sep, os.sep)) or text in (".", ".."):
        return True
    if text.replace(os.sep, "/").count("/") > 1:
        return True
    parent = Path(text).parent
    return str(parent) not in ("", ".") and parent.is_dir()


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


# ---- pushing to the Hub (or any Hub-compatible server at ``HF_ENDPOINT``) ----
class HubPushError(RuntimeError):
    """A push failed; the local files are untouched."""


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload hf_clroute adapter",
    what: str | None = None,
) -> str:
    """Create the repo if needed and upload ``folder`` in one commit; returns the commit URL.

    ``what`` names what the caller pushed in an error (``folder`` is often a temporary
    staging directory, gone by the time the user reads the message)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=commit_message)
    except Exception as err:  # the client raises many types (HTTP, connection, auth)
        # Never echo the token: only the error's type and message.
        raise HubPushError(
            f"push of {what or folder} to {repo_id!r} failed ({type(err).__name__}: {err}); local files are intact"
        ) from err
    return str(info)


def push_adapter(model: "CLModel", repo_id: str, *, extra_dir: str | os.PathLike | None = None,
                 card: str | None = None, **kwargs) -> str:
    """Save ``model`` (plus files in ``extra_dir``, e.g. a card and plots) and push them.

    ``card`` is written as ``README.md`` unless ``extra_dir`` brings its own
    (``CLModel.push_to_hub`` passes a minimal card from the adapter's config).
    """
    with tempfile.TemporaryDirectory(prefix="hf_clroute_push_") as tmp:
        if extra_dir is not None:
            shutil.copytree(extra_dir, tmp, dirs_exist_ok=True)
        model.save_pretrained(Path(tmp))
        if card is not None and not (Path(tmp) / "README.md").exists():
            atomic_write_text(Path(tmp) / "README.md", card)
        what = f"{extra_dir} with this {model.config.method} adapter" if extra_dir else f"this {model.config.method} adapter"
        return push_folder(tmp, repo_id, what=kwargs.pop("what", what), **kwargs)
