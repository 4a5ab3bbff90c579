"""Output to a file or pipe (CI, nohup, a job scheduler): no progress-bar redraws, one line per task;
``progress=False`` says nothing; an image backbone loads without a torchvision warning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.baselines import FinetuneConfig
from hf_clroute.data import class_incremental, load_source
from hf_clroute.engine import make_accelerator
from hf_clroute.runtime.progress import bars_enabled, task_line

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _assert_no_bar(text: str) -> None:
    # tqdm redraws with a carriage return; a terminal bar would also move the cursor with ESC sequences.
    assert "\r" not in text and "\x1b" not in text and "it/s]" not in text, text[:2000]


def test_a_bench_run_into_a_pipe_writes_one_line_per_task_and_no_bar(tiny_suite, tmp_path):
    command = [sys.executable, "-c", "import sys; from hf_clroute.cli import main; sys.exit(main())"]
    # No --no-progress: progress is on, but stdout and stderr are pipes.
    done = subprocess.run([*command, "bench", "--suite", str(tiny_suite), "--methods", "finetune", "--seeds", "0",
                           "--quick", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, env=ENV, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_no_bar(done.stdout + done.stderr)
    lines = done.stderr.splitlines()
    for task in (0, 1):
        ours = [line for line in lines if line.startswith(f"task {task} (")]
        assert len(ours) == 1, lines
        assert " s, mean loss " in ours[0] and "accuracy on seen tasks" in ours[0]
    assert "torchvision" not in done.stderr  # the image backbone loads without the fallback warning


@pytest.fixture(scope="module")
def stream():
    return class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=8,
                             test_per_class=4, name="mnist")


def _fit(stream, progress: bool) -> None:
    import torch
    from transformers import ViTModel

    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.data import ImageCollator

    torch.manual_seed(0)
    config = TrainingConfig(batch_size=8, progress=progress, eval_every=1)
    model = get_cl_model(ViTModel(tiny_vit_config()), FinetuneConfig())
    ContinualTrainer(model, stream, config, ImageCollator(16, num_channels=3), make_accelerator(config, cpu=True)).fit()


def test_progress_off_says_nothing_and_on_says_a_line_per_task(stream, capfd):
    assert not bars_enabled()  # pytest captures stderr: not a terminal
    _fit(stream, progress=False)
    out, err = capfd.readouterr()
    assert "task 0" not in out + err and "\r" not in out + err
    _fit(stream, progress=True)
    out, err = capfd.readouterr()
    _assert_no_bar(out + err)
    assert [line.split(":")[0] for line in err.splitlines() if line.startswith("task ")] == [
        "task 0 (mnist/task0)", "task 1 (mnist/task1)"]


def test_task_line_reads_the_seen_part_of_the_boundary_row():
    assert task_line(1, "s/task1", 2.345, 0.5, [0.5, 0.75, 0.0]) == (
        "task 1 (s/task1): 2.3 s, mean loss 0.5000, accuracy on seen tasks 62.5% [50.0, 75.0]")
    assert task_line(0, "lm/a", 1.0, None, [12.5, 40.0], perplexity=True) == (
        "task 0 (lm/a): 1.0 s, no training loss, perplexity on seen tasks 12.50 [12.50]")


def test_loading_an_image_backbone_twice_warns_about_nothing(tmp_path):
    # A fresh process: transformers warns once per process, so an earlier import here would hide it.
    script = textwrap.dedent(f"""
        import logging, warnings
        import torch
        from transformers import ViTModel
        from hf_clroute.backbones.catalog import load_backbone, tiny_vit_config, vit_image_processor
        from hf_clroute.backbones.pretraining.standins import vit_b16_processor

        logging.basicConfig(level=logging.WARNING)
        warnings.simplefilter("always")
        ViTModel(tiny_vit_config()).save_pretrained({str(tmp_path)!r})
        vit_image_processor(size={{"height": 16, "width": 16}}).save_pretrained({str(tmp_path)!r})
        vit_b16_processor()
        for _ in range(2):
            load_backbone({str(tmp_path)!r})
        print("loaded")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-3000:]
    assert "torchvision" not in done.stderr, done.stderr[-3000:]


def test_listing_methods_and_loading_a_committed_vit_warn_about_nothing():
    # A fresh process, as a first run: `hf-clroute methods` loads no backbone (it imports no pretraining
    # code), and a suite's `pretrained-vit:` backbone, which every demo and bench run on the committed
    # ViTs loads, imports its pretraining module and reads its processor without the torchvision warning.
    script = textwrap.dedent("""
        import contextlib, io, logging, sys, warnings
        from hf_clroute.cli import main

        logging.basicConfig(level=logging.WARNING)
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(io.StringIO()) as listed:
            assert main(["methods"]) == 0
        assert "finetune" in listed.getvalue()
        assert not [m for m in sys.modules if ".pretraining" in m], "listing methods imported pretraining code"
        from hf_clroute.backbones.catalog import load_backbone
        from hf_clroute.bench.harness.suites import resolve_backbone_path

        model, processor = load_backbone(resolve_backbone_path("pretrained-vit:vit-mnist-stream"))
        print("loaded", type(processor).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0 and "loaded ViTImageProcessorPil" in done.stdout, done.stderr[-3000:]
    assert "torchvision" not in done.stdout + done.stderr, done.stderr[-3000:]
