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


def push_run(run_dir: str | os.PathLike, repo_id: str, *, method: str | None = None, **kwargs) -> str:
    """Push one method's adapter from a bench run, with its model card and plots, in one commit.

    ``run_dir`` is an ``hf-clroute bench --out`` directory (results.json, plots/,
    adapters/<method>/). Everything is staged in a temporary directory first.
    """
    import json

    from .cards import build_card

    run_dir = Path(run_dir)
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{run_dir} is not a bench run directory (no results.json)")
    results = json.loads(results_file.read_text())
    methods = sorted(p.name for p in (run_dir / "adapters").iterdir()) if (run_dir / "adapters").is_dir() else []
    method = method or (methods[0] if len(methods) == 1 else None)
    if method is None or method not in methods:
        raise ValueError(f"choose the adapter to push with --method; {run_dir} holds {methods}")
    adapter_dir = run_dir / "adapters" / method
    plots = sorted(p.name for p in (run_dir / "plots").glob("*.png")) if (run_dir / "plots").is_dir() else []
    plots = [p for p in plots if not p.startswith("accuracy_matrix_") or p == f"accuracy_matrix_{method}.png"]
    with tempfile.TemporaryDirectory(prefix="hf_clroute_push_") as tmp:
        stage = Path(tmp)
        shutil.copytree(adapter_dir, stage, dirs_exist_ok=True)
        (stage / "plots").mkdir()
        for name in plots:
            shutil.copy2(run_dir / "plots" / name, stage / "plots" / name)
        one_method = {**results, "methods": {method: results["methods"][method]}}
        (stage / "results.json").write_text(json.dumps(one_method, indent=2, sort_keys=True) + "\n")
        adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
        build_card(results, method, repo_id, adapter_config, plots).save(stage / "README.md")
        return push_folder(stage, repo_id, **kwargs)
