"""Publishing a bench run: one method's adapter with its model card and plots, in one commit."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from hf_clroute.core.model import load_config, write_readme
from hf_clroute.core.model_card import peft_auto_class, write_eval_results
from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import PEFT_CONFIG_NAME, push_folder, read_json


def push_run(run_dir: str | os.PathLike, repo_id: str, *, method: str | None = None, **kwargs) -> str:
    """Push one method's adapter from a bench run, with its model card and plots, in one commit.

    ``run_dir`` is an ``hf-clroute bench --out`` directory (results.json, plots/,
    adapters/<method>/). Everything is staged in a temporary directory first. ``kwargs`` go to
    :func:`hf_clroute.hub.io.push_folder` (``token``, ``private``, ``revision``, ``create_pr``, ``timeout``).
    """
    import json

    from hf_clroute.bench.reports.cards import build_card

    run_dir = Path(run_dir)
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{run_dir} is not a bench run directory (no results.json)")
    results = json.loads(results_file.read_text())
    methods = sorted(p.name for p in (run_dir / "adapters").iterdir()) if (run_dir / "adapters").is_dir() else []
    if method is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", method):
        raise UserInputError(f"--method {method!r} is not a method name (letters, digits, '_', '-', '.', '+', no "
                             f"path); the adapters of {run_dir} are {methods}")
    if method is not None and method not in methods:
        raise UserInputError(f"--method {method!r}: {run_dir} holds no adapter of that method; it holds {methods}")
    method = method or (methods[0] if len(methods) == 1 else None)
    if method is None:
        raise UserInputError(f"choose the adapter to push with --method; {run_dir} holds {methods}")
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
        # Our config, in any layout (a PEFT method's adapter_config.json is PEFT's own).
        adapter_config = load_config(adapter_dir).to_dict()
        peft_file = adapter_dir / PEFT_CONFIG_NAME
        peft_type = read_json(peft_file).get("peft_type") if peft_file.is_file() else None
        peft_format = peft_auto_class(read_json(peft_file).get("task_type")) if peft_type else False
        build_card(results, method, repo_id, adapter_config, plots, peft_format).save(stage / "README.md")
        write_eval_results(stage, one_method, method)  # the Hub's evaluation results, beside the model-index
        write_readme(stage, load_config(adapter_dir))  # the card shows how to load it (adds the line if missing)
        return push_folder(stage, repo_id, what=f"{run_dir} (adapter {method})", **kwargs)
