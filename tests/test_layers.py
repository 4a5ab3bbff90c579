"""The package's three layers import only downward, and no module is part of an import cycle."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_clroute"
LAYERS = ("engine", "bench")  # everything else under hf_clroute/ (but cli and testing) is the core


def modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "continual_learning" in parts:  # the `evaluate` module script, loaded by path
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:  # the package facade: lazy exports from every layer
        return "app"
    if parts[1] in LAYERS:
        return parts[1]
    return "app" if parts[1] in ("cli", "testing") else "core"


def imported_modules(module: str) -> set[str]:
    """Every hf_clroute module ``module`` imports, at top level or inside functions."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(strip_type_checking(ast.parse(path.read_text()))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:  # `from . import x`: x is a module of the package
                found.update(f"{target}.{alias.name}" for alias in node.names)
            else:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "hf_clroute" or m.startswith("hf_clroute.")}


def strip_type_checking(tree: ast.Module) -> ast.Module:
    """Drop ``if TYPE_CHECKING:`` blocks: annotations only, never executed."""
    for node in ast.walk(tree):
        for name in ("body", "orelse"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                setattr(node, name, [n for n in block if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))])
    return tree


ALLOWED = {"core": {"core"}, "engine": {"core", "engine"}, "bench": {"core", "engine", "bench"},
           "app": {"core", "engine", "bench", "app"}}


def test_layers_import_only_downward():
    upward = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module in modules()
        for target in imported_modules(module)
        if layer_of(target) not in ALLOWED[layer_of(module)]
    ]
    assert not upward, "\n".join(upward)


def test_routing_methods_do_not_import_baselines():
    offenders = [f"{m} imports {t}" for m in modules() if m.startswith("hf_clroute.methods")
                 for t in imported_modules(m) if t.startswith("hf_clroute.baselines")]
    assert not offenders, offenders


@pytest.mark.parametrize("module", modules())
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    # A cycle shows up as an ImportError ("partially initialized module") when the
    # cycle's modules are entered from this one first.
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_no_import_cycle_between_modules():
    graph = {m: {t for t in imported_modules(m) if t in set(modules())} for m in modules()}
    # A package's __init__ importing its own submodules is not a cycle of interest.
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_readme_layout_names_every_module_of_the_package():
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("### Where a run's settings come from")]
    words = set(re.findall(r"[A-Za-z_]+", layout))
    unnamed = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                     if path.stem != "__init__" and path.stem not in words)
    assert not unnamed, f"README's Layout section does not name: {', '.join(unnamed)}"
