"""The built wheel works outside the repository: built from a clean copy of the package, installed with its
dependencies into a fresh virtual environment in a temporary folder, and run from another folder: `hf-clroute
--help`, `hf-clroute methods`, a committed backbone loaded through the package's API, and a quick benchmark on
MNIST from the prepared cache (a two-task suite written here, no download).

The clean copy holds what the wheel is built from (pyproject.toml, README.md, hf_clroute/): a `build/` folder
left in a checkout by an earlier build would otherwise put files deleted since into the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_clroute.data.sources import source_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU build: installed first, so pip never resolves the dependency to a CUDA build


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def clean_copy(out: Path) -> Path:
    out.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, out / name)
    shutil.copytree(REPO / "hf_clroute", out / "hf_clroute",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return out


@pytest.fixture
def venv_dir(tmp_path):
    """Where the fresh environment goes; removed afterwards (pytest keeps its last temp folders)."""
    yield tmp_path / "venv"
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


def test_installed_wheel_runs_outside_the_repository(tmp_path, venv_dir):
    if not (source_dir("mnist") / "train.parquet").exists():
        pytest.skip("MNIST is not prepared (hf-clroute data prepare mnist)")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(clean_copy(tmp_path / "src")),
         "-w", str(tmp_path / "dist")], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("hf_clroute-*.whl")
    run([sys.executable, "-m", "venv", str(venv_dir)], cwd=tmp_path)
    python, cli = venv_dir / "bin" / "python", venv_dir / "bin" / "hf-clroute"
    # --no-compile: no .pyc for torch's thousands of files at install time (a first import writes its own).
    run([str(python), "-m", "pip", "install", "-q", "--no-compile", TORCH], cwd=tmp_path)
    run([str(python), "-m", "pip", "install", "-q", "--no-compile", str(wheel)], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "cache" / "data").mkdir(parents=True)
    (elsewhere / "cache" / "data" / "mnist").symlink_to(source_dir("mnist"))  # the prepared MNIST, read only
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_CLROUTE_CACHE=str(elsewhere / "cache"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")

    assert "push-results" in run([str(cli), "--help"], cwd=elsewhere, env=env)
    assert "ncm" in run([str(cli), "methods"], cwd=elsewhere, env=env)
    where = run([str(python), "-c", "import hf_clroute; print(hf_clroute.__file__)"], cwd=elsewhere, env=env)
    assert Path(where.strip()).is_relative_to(venv_dir), where  # the installed copy, not the checkout
    loaded = run([str(python), "-c", (
        "from hf_clroute.backbones.catalog import load_backbone\n"
        "model, processor = load_backbone('pretrained-vit:vit-mnist-stream')\n"
        "print(type(model).__name__, model.config.hidden_size)")], cwd=elsewhere, env=env)
    assert loaded.startswith("ViTModel"), loaded

    suite = {"name": "wheel-mnist", "dataset": "mnist", "backbone": "pretrained-vit:vit-mnist-stream",
             "n_tasks": 2, "max_classes": 4, "train_per_class": 8, "test_per_class": 4,
             "training": {"batch_size": 8, "eval_every": 2}, "methods": ["ncm"]}
    (elsewhere / "suite.json").write_text(json.dumps(suite))
    run([str(cli), "bench", "--suite", "suite.json", "--methods", "ncm", "--seeds", "0", "--out", "run"],
        cwd=elsewhere, env=env)
    results = json.loads((elsewhere / "run" / "results.json").read_text())
    assert results["methods"]["ncm"]["per_seed"][0]["accuracy_matrix"], results
