"""Rough edges a stranger meets first: load noise, file modes, cards, error messages, reuse of a
backbone, unknown methods, help texts. One small test per point."""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path

import pytest
import torch
from datasets import ClassLabel, Dataset
from huggingface_hub import hf_hub_download, list_repo_files
from transformers import ViTForImageClassification, ViTImageProcessor, ViTModel

from hf_clroute import get_cl_model
from hf_clroute.backbones.catalog import load_backbone, tiny_vit_config
from hf_clroute.baselines import FinetuneConfig
from hf_clroute.cli import build_parser, main
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import CLModel
from hf_clroute.data import Experience
from hf_clroute.hub.io import (
    HubPushError,
    atomic_write_text,
    looks_local,
    resolve_pretrained_dir,
)
from hf_clroute.methods.rwf import RwfConfig


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_loading_a_classification_checkpoint_as_backbone_prints_no_load_report(tmp_path):
    ViTForImageClassification(tiny_vit_config(num_labels=3)).save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(tmp_path)
    records = _Records()
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addHandler(records)
    try:
        ViTModel.from_pretrained(tmp_path)  # transformers itself reports classifier/pooler keys...
        assert any("LOAD REPORT" in m for m in records.messages)
        records.messages.clear()
        model, _ = load_backbone(tmp_path)  # ...which load_backbone means, so says nothing
    finally:
        logger.removeHandler(records)
    assert isinstance(model, ViTModel) and not any("LOAD REPORT" in m for m in records.messages)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_saved_files_honour_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        model = get_cl_model(ViTModel(tiny_vit_config()), FinetuneConfig())
        model.save_pretrained(tmp_path / "adapter")
    finally:
        os.umask(old)
    saved = sorted((tmp_path / "adapter").iterdir())  # the config and the weights, whatever their names
    assert len(saved) >= 2
    for path in (tmp_path / "a.json", *saved):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path


def _labelled_model() -> CLModel:
    model = get_cl_model(ViTModel(tiny_vit_config()), FinetuneConfig())
    ds = Dataset.from_dict({"features": [[0.0] * 32] * 2, "label": [0, 1]}).cast_column(
        "label", ClassLabel(names=["cat", "dog"]))
    model.grow_head(2)
    model.begin_task(Experience(0, "pets/task0", [0, 1], ds, ds), StepContext(task_id=0))
    return model


def test_python_push_uploads_a_minimal_card(hub_server, hub_repo_id):
    _labelled_model().push_to_hub(hub_repo_id)
    assert "README.md" in list_repo_files(hub_repo_id)
    card = Path(hf_hub_download(hub_repo_id, "README.md")).read_text()
    assert "library_name: hf_clroute" in card and "**finetune**" in card
    assert "| 0 | cat | 0 |" in card and "| 1 | dog | 1 |" in card and "task `pets/task0`" in card


def test_failed_push_names_what_the_user_pushed(hub_down_endpoint, hub_repo_id):
    with pytest.raises(HubPushError) as err:
        _labelled_model().push_to_hub(hub_repo_id)
    assert "push of this finetune adapter to" in str(err.value) and "hf_clroute_push_" not in str(err.value)


def test_a_mistyped_local_path_is_not_called_a_bad_repo_id(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for typo in ("./adapter", "../adapter", str(tmp_path / "adapter"), "~/no-such-adapter-dir",
                 "runs/walk/adapters/rwf", "runs/typo"):
        with pytest.raises(FileNotFoundError, match=re.escape(f"no adapter directory at {typo}")):
            resolve_pretrained_dir(typo)
    assert not looks_local("me/my-adapter")  # a repo id stays a repo id
    assert main(["evaluate", "--adapter", "runs/walk/adapters/rwf", "--suite", "split-mnist"]) == 2
    assert "no adapter directory at runs/walk/adapters/rwf" in capsys.readouterr().err


@pytest.mark.parametrize("suite", ["split-mnist", "drifting-regression", "charlm-domains"])
def test_an_unknown_method_leaves_no_output_dir(tmp_path, suite, capsys):
    out = tmp_path / "out"
    assert main(["bench", "--suite", suite, "--methods", "no-such-method", "--seeds", "0", "--out", str(out)]) == 2
    assert "no-such-method" in capsys.readouterr().err and not out.exists()


def test_from_pretrained_twice_on_the_trained_backbone(tmp_path):
    """README's pattern: `same = type(model).from_pretrained(backbone, ...)` right after training on it."""
    torch.manual_seed(0)
    backbone = ViTModel(tiny_vit_config())
    model = get_cl_model(backbone, RwfConfig())
    model.grow_head(3)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval()
    pixels = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    expected = model(**pixels).logits
    model.save_pretrained(tmp_path)
    same = type(model).from_pretrained(backbone, tmp_path).eval()
    again = type(model).from_pretrained(backbone, tmp_path).eval()
    assert torch.equal(same(**pixels).logits, expected) and torch.equal(again(**pixels).logits, expected)
    assert torch.equal(model(**pixels).logits, expected)  # the trained model is left as it was
    assert same.backbone is not model.backbone


def test_every_cli_option_has_help():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.dest}" for name, sub in subparsers.choices.items() for action in sub._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert not missing, f"options without a help text: {missing}"
    assert all(choice.help for choice in subparsers._choices_actions)


@pytest.mark.slow
def test_train_runs_under_accelerate_launch_and_resumes(tiny_suite, tmp_path):
    """`hf-clroute train` for the installed package: stopped after a few steps (here, in this process: the
    launch is the slow part), then resumed to the end by `accelerate launch -m hf_clroute.cli train --resume`
    in a fresh process, one process (as a relaunched single-GPU job runs it)."""
    import json
    import subprocess
    import sys

    train = ["train", "--suite", str(tiny_suite), "--method", "finetune", "--quick", "--output-dir",
             str(tmp_path / "run"), "--checkpoint-every", "2", "--no-progress"]
    assert main([*train, "--stop-after-steps", "3"]) == 0
    assert not json.loads((tmp_path / "run" / "result.json").read_text())["finished"]
    assert not (tmp_path / "run" / "adapter").exists()  # a stopped run publishes no adapter as finished
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "hf_clroute.cli", *train]
    done = subprocess.run([*launch, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["finished"] and result["num_processes"] == 1 and result["resumed_from"]
    assert result["settings"]["sources"]["training.checkpoint_every"] == "the command line"
    assert (tmp_path / "run" / "adapter").is_dir()
