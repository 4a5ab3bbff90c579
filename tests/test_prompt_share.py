"""training/prompt_share.py: RwF's parameter share beside the prompt methods' (the count behind the
reproduction table's CODA-Prompt row), on a tiny ViT so the test is quick."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
from transformers import ViTConfig, ViTModel

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("prompt_share", ROOT / "training" / "prompt_share.py")
prompt_share = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prompt_share)


def tiny_vit() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=6, num_attention_heads=2, intermediate_size=64,
                              image_size=16, patch_size=4))


def test_coda_prompt_holds_every_tasks_components_and_trains_the_last_ones(monkeypatch):
    monkeypatch.setattr(prompt_share, "vit_b16", tiny_vit)
    row = prompt_share.count("coda-prompt", tasks=3, classes=6)
    cfg = row["config"]
    blocks = 5  # the paper's prompted blocks 0-4, all present in a 6-block ViT
    per_task = cfg["components_per_task"] * (cfg["prompt_length"] * 32 + 2 * 32) * blocks  # prompts, keys, attention
    assert row["added_params"] == 3 * per_task and row["trainable_params"] == per_task
    assert row["backbone_params"] == sum(p.numel() for p in tiny_vit().parameters())


def test_the_head_and_the_backbone_are_not_counted(monkeypatch):
    monkeypatch.setattr(prompt_share, "vit_b16", tiny_vit)
    small, large = prompt_share.count("rwf", tasks=2, classes=4), prompt_share.count("rwf", tasks=2, classes=40)
    assert small["added_params"] == large["added_params"] > 0  # the linear head grows, the count does not
    assert small["added_params"] == small["trainable_params"]  # RwF's routers all train throughout


def test_the_command_writes_its_json(tmp_path, monkeypatch, capsys):
    # `python training/prompt_share.py ...`'s own main, in this process (a fresh interpreter costs seconds of imports)
    out = tmp_path / "share.json"
    monkeypatch.setattr(sys, "argv", ["prompt_share.py", "--methods", "l2p", "--tasks", "2", "--out", str(out)])
    prompt_share.main()
    assert capsys.readouterr().out.startswith("l2p ")
    saved = json.loads(out.read_text())
    assert saved["backbone"] == "vit-b16" and saved["methods"]["l2p"]["added_pct"] > 0
