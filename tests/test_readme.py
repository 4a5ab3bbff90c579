"""Every ```bash block of README.md runs, so a README command never again points at a
missing file, option or suite.

Each block runs as one bash script (``set -e``) in a scratch copy of the checkout
(``training/``, ``configs/``, ``results/`` and a link to the venv), in order, sharing
``runs/`` between blocks. The data cache is the real one (linked, read only) with a tiny
stand-in for the pretrained ViT, so a command that would pretrain it for 20 minutes
loads it instead. Pushes go to the tests' local Hub (``HF_ENDPOINT``); the walkthrough
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
    "make setup data": "installs system packages, torch and the venv: done once per machine, before any test",
    "hf-clroute bench --suite charlm-domains": "trains four char-level GPT-2 variants over three text domains: "
                                               "over 6 minutes on 2 cores even at quick sizes (test_apn covers the runner)",
}

#: quick-size rewrites: (regex on the command, replacement, why)
REWRITES = [
    (r"^make demo$", "hf-clroute demo --out runs/demo",
     "`make demo` is setup + data (done once per machine, before any test) + this command"),
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

    from hf_clroute.backbones import tiny_vit_config
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
