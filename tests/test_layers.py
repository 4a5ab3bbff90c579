"""The package's rooms import only downward, stay small, and no module is part of an import cycle."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_clroute"

# The rooms, lowest first: a module may import its own room, a room of its rank, or any room ranked below it.
# The longest matching prefix names a module's room.
ROOMS = {
    "errors": 0, "runtime": 0,
    "hub": 1, "data": 1, "metrics": 1,
    "backbones": 2, "heads": 2,
    "core": 3,
    "methods": 4, "baselines": 4,
    "engine": 5,
    "bench.harness": 6, "bench.studies": 7, "bench.reports": 8, "bench.runners": 9,
    "commands": 10,
    "cli": 11, "testing": 11, "": 11,  # "": the package facade (lazy exports from every room)
}


def modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "continual_learning" in parts:  # the `evaluate` module script, loaded by path
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = set(modules())


def room_of(module: str) -> str:
    rest = module.removeprefix("hf_clroute").removeprefix(".")
    if rest in ("bench",):  # the bench package itself: only its docstring
        return "bench.harness"
    return max((room for room in ROOMS if rest == room or rest.startswith(room + ".") or room == ""), key=len)


def imported_modules(module: str) -> set[str]:
    """Every hf_clroute module ``module`` imports, at top level or inside functions."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):  # TYPE_CHECKING blocks included
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from package import module` imports the module
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "hf_clroute" or m.startswith("hf_clroute.")}


def test_rooms_import_only_downward():
    upward = [
        f"{module} ({room_of(module)}) imports {target} ({room_of(target)})"
        for module in modules()
        for target in imported_modules(module)
        if ROOMS[room_of(target)] > ROOMS[room_of(module)]
    ]
    assert not upward, "\n".join(upward)


def test_package_root_shows_the_layers():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "cli.py"))
    assert len(loose) <= 8, loose
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rooms <= {r.split(".")[0] for r in ROOMS if r} | {"bench"}, rooms


def test_rooms_stay_small():
    for folder in {p.parent for p in PACKAGE.rglob("*.py")}:
        files = list(folder.glob("*.py"))
        lines = sum(len(f.read_text().splitlines()) for f in files)
        assert len(files) <= 15 and lines <= 4000, f"{folder}: {len(files)} modules, {lines} lines"
    long = [f"{p}: {n}" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600]
    assert not long, long


def test_routing_methods_do_not_import_baselines():
    offenders = [f"{m} imports {t}" for m in modules() if m.startswith("hf_clroute.methods")
                 for t in imported_modules(m) if t.startswith("hf_clroute.baselines")]
    assert not offenders, offenders


def test_each_module_imports_first_in_a_fresh_package():
    # A cycle shows up as an ImportError ("partially initialized module") when the cycle's modules are
    # entered from this one first. One interpreter: every hf_clroute module is dropped before the next
    # import, so each is entered first (torch and transformers stay loaded, which is what keeps this fast).
    script = (
        "import importlib, sys, traceback\n"
        f"mods = {modules()!r}\n"
        "bad = []\n"
        "for m in mods:\n"
        "    for k in [k for k in sys.modules if k == 'hf_clroute' or k.startswith('hf_clroute.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception:\n"
        "        bad.append(m + ': ' + traceback.format_exc(limit=3))\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


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


def test_layout_page_names_every_module_of_the_package():
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text()
    words = set(re.findall(r"[A-Za-z_]+", layout))
    unnamed = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                     if path.stem != "__init__" and path.stem not in words)
    assert not unnamed, f"docs/layout.md does not name: {', '.join(unnamed)}"
