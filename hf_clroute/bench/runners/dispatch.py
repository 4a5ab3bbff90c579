"""The three benchmark runners, found by a suite's ``runner`` kind.

* ``classification`` (the default): every method side by side on a class-incremental
  stream (``hf_clroute.bench.runners.classification``);
* ``charlm``: APN vs dense FFN over text domains on a character-level GPT-2 (``lm``);
* ``plasticity``: QOA vs backprop over hundreds of small tasks (``plasticity``);
* ``headroom``: each adapter trained on a classification suite's tasks joined into one, then
  the same readouts on its features and on the frozen backbone's (``headroom``).

Each runner module has the same shape: ``run(name_or_path, *, methods, seeds, quick, out, ...)``
writes ``out/results.json`` (with ``"kind"``) and ``out/results.md``; ``merge(run_dirs, out, drop)``
joins runs of one suite (e.g. seeds run as parallel processes) into one.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from hf_clroute.bench.harness.suites import read_suite_file

KINDS = ("classification", "charlm", "plasticity", "headroom")


def runner_module(kind: str) -> ModuleType:
    """The module that runs suites of ``kind`` (imported on use: each pulls in its own stack)."""
    if kind == "classification":
        from hf_clroute.bench.runners import classification as module
    elif kind == "charlm":
        from hf_clroute.bench.runners import lm as module
    elif kind == "plasticity":
        from hf_clroute.bench.runners import plasticity as module
    elif kind == "headroom":
        from hf_clroute.bench.studies import headroom as module
    else:
        raise ValueError(f"unknown suite runner {kind!r}; known runners: {list(KINDS)}")
    return module


def suite_kind(name_or_path: str) -> str:
    """A suite file's ``runner`` (``classification`` when it names none)."""
    kind = read_suite_file(name_or_path)[1].get("runner", "classification")
    if kind not in KINDS:
        raise ValueError(f"suite {name_or_path!r}: unknown runner {kind!r}; known runners: {list(KINDS)}")
    return kind


def results_kind(run_dir: str | Path) -> str:
    """The runner that wrote ``run_dir/results.json``."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a bench run directory (no results.json)")
    results = json.loads(path.read_text())
    if "kind" in results:
        return results["kind"]
    legacy = results.get("config", {}).get("runner", "")  # written before results named their kind
    return "charlm" if "lm" in legacy else "plasticity" if "plasticity" in legacy else "classification"


def rewrite_markdown(results_root: Path) -> None:
    """Every classification and headroom table's ``results.md`` under ``results_root`` written again from its
    results.json, so its marks (an edge pick, a short row) follow today's rules (``hf-clroute report`` calls
    this before it strings the tables together)."""
    from hf_clroute.hub.io import atomic_write_text

    for path in sorted(results_root.glob("*/results.json")):
        results = json.loads(path.read_text())
        kind = "classification" if "reference" in results else results.get("kind")
        if kind in ("classification", "headroom"):
            atomic_write_text(path.parent / "results.md", runner_module(kind).results_markdown(results))
