"""The one way a runner writes its results: ``results.json`` (with its ``kind``) and ``results.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..io import atomic_write_text


def write_run(out: Path, results: dict[str, Any], markdown: str) -> dict[str, Any]:
    """Write ``out/results.json`` and ``out/results.md`` atomically; ``results['kind']`` names the runner."""
    if results.get("kind") not in ("classification", "charlm", "plasticity", "headroom"):
        raise ValueError(f"results must say which runner wrote them ('kind'), got {results.get('kind')!r}")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "results.md", markdown)
    return results


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"
