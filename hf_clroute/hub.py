"""Pushing adapters to the Hub (or any Hub-compatible server at ``HF_ENDPOINT``).

A push first writes everything to a temporary directory and uploads that in one
commit, so a failed push (server down, auth refused) leaves the caller's files
exactly as they were and the remote repo at its previous commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .model import CLModel


class HubPushError(RuntimeError):
    """A push failed; the local files are untouched."""


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload hf_clroute adapter",
) -> str:
    """Create the repo if needed and upload ``folder`` in one commit; returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=commit_message)
    except Exception as err:  # the client raises many types (HTTP, connection, auth)
        # Never echo the token: only the error's type and message.
        raise HubPushError(
            f"push of {folder} to {repo_id!r} failed ({type(err).__name__}: {err}); local files are intact"
        ) from err
    return str(info)


def push_adapter(model: "CLModel", repo_id: str, *, extra_dir: str | os.PathLike | None = None, **kwargs) -> str:
    """Save ``model`` (plus files in ``extra_dir``, e.g. a card and plots) and push them."""
    with tempfile.TemporaryDirectory(prefix="hf_clroute_push_") as tmp:
        if extra_dir is not None:
            shutil.copytree(extra_dir, tmp, dirs_exist_ok=True)
        model.save_pretrained(Path(tmp))
        return push_folder(tmp, repo_id, **kwargs)
