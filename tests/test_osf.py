"""OSF from PEFT as a baseline: the preserved subspace does not move, grows at each task, saves in PEFT's format."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import BertModel, ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import pooled_features, tiny_bert_config, tiny_vit_config
from hf_clroute.baselines.osf import OsfBaseline, OsfConfig
from hf_clroute.baselines.osf.method import effective_weight
from hf_clroute.bench.harness.settings import method_file, resolve_run
from hf_clroute.bench.harness.suites import SuiteConfig
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import PEFT_WEIGHTS_NAME, WEIGHTS_NAME, CLModel
from hf_clroute.core.registry import get_method
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator

FAMILIES = {
    "vit": (ViTModel, tiny_vit_config),
    "bert": (BertModel, tiny_bert_config),
}


def saved_backbone(tmp_path: Path, family: str) -> str:
    model_cls, config = FAMILIES[family]
    torch.manual_seed(0)
    model_cls(config()).save_pretrained(tmp_path / family)
    return str(tmp_path / family)


def batch(family: str, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor([0, 1, 2, 3] * 2)
    if family == "vit":
        return {"pixel_values": torch.randn(8, 3, 16, 16, generator=generator), "labels": labels}
    mask = torch.ones(8, 10, dtype=torch.long)
    mask[::2, 7:] = 0
    return {"input_ids": torch.randint(5, 100, (8, 10), generator=generator), "attention_mask": mask, "labels": labels}


def inputs(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in data.items() if k != "labels"}


def train_task(model: CLModel, task: int, data: dict[str, torch.Tensor], steps: int = 8) -> None:
    """One task as the engine runs it: begin_task, then a fresh AdamW, steps, and after_step after each."""
    model.method.begin_task(model, SimpleNamespace(classes=[0, 1, 2, 3]), StepContext(task))
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        out = model(**data)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.after_step(data, out, StepContext(task))
    model.eval()


def top_subspaces(model: CLModel) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per target: its effective weight now and the top singular vectors (left, right) it preserves now."""
    found = {}
    for name, layer in model.method.layers().items():
        weight = effective_weight(layer).detach()
        U, _, Vh = torch.linalg.svd(weight)
        k = layer.effective_rank["default"]
        found[name] = weight, U[:, :k], Vh[:k]
    return found


def leak(before, model: CLModel) -> tuple[float, float]:
    """Largest relative move of a weight inside its preserved directions, and smallest relative move overall."""
    inside, moved = [], []
    for name, layer in model.method.layers().items():
        weight, U, Vh = before[name]
        change = effective_weight(layer).detach() - weight
        inside.append(max((U.T @ change).norm(), (change @ Vh.T).norm()) / change.norm())
        moved.append(change.norm() / weight.norm())
    return float(max(inside)), float(min(moved))


def test_registered_and_each_bad_setting_names_its_field():
    entry = get_method("osf")
    assert entry.config_class is OsfConfig and entry.method_class is OsfBaseline
    bad = [({"effective_rank": 1.0}, "OsfConfig.effective_rank"), ({"effective_rank": 0}, "OsfConfig.effective_rank"),
           ({"rank_growth": -0.1}, "OsfConfig.rank_growth"),
           ({"max_effective_rank": 1.0}, "OsfConfig.max_effective_rank"),
           ({"effective_rank": 0.5, "max_effective_rank": 0.4}, "OsfConfig.max_effective_rank"),
           ({"target_modules": []}, "OsfConfig.target_modules"), ({"reproject": "yes"}, "OsfConfig.reproject"),
           ({"freeze_backbone": False}, "OsfConfig.freeze_backbone")]
    for fields, message in bad:
        with pytest.raises(ValueError, match=message):
            OsfConfig(**fields)
    assert [OsfConfig(effective_rank=0.5, rank_growth=0.15).fraction_at(t) for t in range(4)] == [0.5, 0.65, 0.8, 0.9]
    torch.manual_seed(0)
    vit = ViTModel(tiny_vit_config())
    with pytest.raises(ValueError, match=r"OsfConfig.effective_rank 0.01 preserves no direction of layers.0"):
        get_cl_model(vit, OsfConfig(effective_rank=0.01))
    with pytest.raises(ValueError, match=r"OsfConfig.target_modules \['nowhere'\] match no module"):
        get_cl_model(ViTModel(tiny_vit_config()), OsfConfig(target_modules=["nowhere"]))
    with pytest.raises(ValueError, match=r"OsfConfig.target_modules: layers.0.layernorm_before is a LayerNorm"):
        get_cl_model(ViTModel(tiny_vit_config()), OsfConfig(target_modules=["layernorm_before"]))


def test_settings_file_names_its_head_only_control_and_searches_the_shared_budget(checked_search_grid):
    settings = method_file("osf")
    assert settings["summary"] and settings["control"] == "osf-head-only"
    grid = checked_search_grid("osf")
    assert {p["config.effective_rank"] for p in grid} == {0.3, 0.5}
    suite = SuiteConfig.load("split-mnist")
    osf, control = resolve_run(suite, "osf", 0), resolve_run(suite, "osf-head-only", 0)
    assert control.registered_method == "finetune" and control.adapter_config.freeze_backbone
    assert control.adapter_config.current_task_loss == osf.adapter_config.current_task_loss
    assert control.adapter_config.head == osf.adapter_config.head == "linear"
    assert control.training.learning_rate == osf.training.learning_rate


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_preserved_directions_do_not_move_and_the_preserved_rank_grows(family):
    model_cls, config = FAMILIES[family]
    torch.manual_seed(0)
    model = get_cl_model(model_cls(config()), OsfConfig(effective_rank=0.3, rank_growth=0.2))
    model.grow_head(4)
    data = batch(family)
    targets = model.method.layers()
    assert len(targets) == 12  # 6 projections in each of 2 blocks; never the pooler
    for task, fraction in enumerate((0.3, 0.5, 0.7)):
        if task:  # the boundary: the update consolidated, the weights decomposed again, the outputs unchanged
            with torch.no_grad():
                logits = model(**inputs(data)).logits
            model.method.begin_task(model, SimpleNamespace(classes=[0, 1, 2, 3]), StepContext(task))
            with torch.no_grad():
                torch.testing.assert_close(model(**inputs(data)).logits, logits, rtol=0, atol=1e-5)
        for name, layer in model.method.layers().items():
            assert layer.effective_rank["default"] == int(min(layer.get_base_layer().weight.shape) * fraction), name
        before = top_subspaces(model)
        train_task(model, task, data)
        inside, moved = leak(before, model)
        # moved, but only in the complement: what is left inside is float32 rounding (amplified where two singular
        # values nearly tie, which makes the top subspace itself ill-defined); AdamW alone leaks > 1e-2 (below)
        assert inside < 1e-3 and moved > 1e-2, (task, inside, moved)
    original = ViTModel if family == "vit" else BertModel
    assert isinstance(model.backbone, original)


def test_without_reprojection_adamw_leaks_into_the_preserved_directions():
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config()), OsfConfig(reproject=False))
    model.grow_head(4)
    before = top_subspaces(model)
    train_task(model, 0, batch("vit"))
    inside, _ = leak(before, model)
    assert inside > 1e-2  # PEFT's gradient projection alone, under AdamW's per-coordinate steps


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_saved_in_peft_format_loads_with_peft_and_with_ours(tmp_path, family):
    model_cls, _ = FAMILIES[family]
    base = saved_backbone(tmp_path, family)
    model = get_cl_model(model_cls.from_pretrained(base), OsfConfig())
    model.grow_head(4)
    data = batch(family)
    for task in range(2):  # a boundary: PEFT's file must carry the consolidated base weights
        train_task(model, task, data, steps=5)
    model.save_pretrained(tmp_path / "adapter")
    peft_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert peft_config["peft_type"] == "OSF" and peft_config["effective_rank"] == 0.4
    assert peft_config["base_model_name_or_path"] == base
    with safe_open(str(tmp_path / "adapter" / PEFT_WEIGHTS_NAME), framework="pt") as handle:
        peft_keys = set(handle.keys())
    with safe_open(str(tmp_path / "adapter" / WEIGHTS_NAME), framework="pt") as handle:
        our_keys = set(handle.keys())
    assert all(k.startswith("base_model.model.") and (".osf_svd_params." in k or k.endswith(".base_layer.weight"))
               for k in peft_keys) and len(peft_keys) == 12 * 4
    assert our_keys - {"head.weight", "head.bias"} == {k for k in our_keys if "_osf_U_high" in k or "_osf_V_high" in k}
    view = inputs(batch(family, seed=1))
    with torch.no_grad():
        ours = model(**view).logits
        peft = PeftModel.from_pretrained(model_cls.from_pretrained(base), tmp_path / "adapter").eval()
        features = pooled_features(model.spec, peft(**view), view.get("attention_mask"))
        torch.testing.assert_close(model.head(features), ours, rtol=0, atol=1e-6)
        loaded = CLModel.from_pretrained(model_cls.from_pretrained(base), tmp_path / "adapter")
        assert torch.equal(loaded(**view).logits, ours)
    assert loaded.method.task == 1 and loaded.method.fraction == 0.4
    for name, layer in loaded.method.layers().items():  # the preserved directions come back, to keep training
        assert torch.equal(layer._osf_U_high["default"], model.method.layers()[name]._osf_U_high["default"])


# ---- the engine: resume, and one process against two ------------------------------------------------------
@pytest.fixture(scope="module")
def stream():
    return class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=20,
                             test_per_class=10, name="mnist")


def fit(stream, **training):
    cfg = tiny_vit_config()
    config = TrainingConfig(**{"batch_size": 8, "learning_rate": 1e-3, "progress": False, **training})
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(cfg), OsfConfig())
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    return ContinualTrainer(model, stream, config, collator, make_accelerator(config, cpu=True))


def test_resume_mid_task_after_a_boundary_equals_uninterrupted(stream, tmp_path):
    full = fit(stream).fit()
    ckpt = tmp_path / "ckpt"
    stopped = fit(stream, checkpoint_dir=str(ckpt), checkpoint_every=3, stop_after_steps=8).fit()
    assert not stopped.finished
    resumed = fit(stream, checkpoint_dir=str(ckpt), checkpoint_every=3).fit(resume_from=ckpt)
    assert resumed.finished and resumed.accuracy_matrix == full.accuracy_matrix


# One vs two processes: `osf` is one of tests/test_engine.py's TWO_PROCESS_RUNS (one shared launch).
