"""The cosine (normalised linear) head: its logits, growth, saving, task masking, the methods that
use it, its validation and its place in a `hf-clroute tune` grid."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, L2PConfig
from hf_clroute.bench.harness.settings import (
    CONFIG_ROOT,
    SETTINGS_FOLDERS,
    method_file,
    method_search,
    resolve_run,
    settings_label,
    settings_path,
)
from hf_clroute.bench.harness.suites import SuiteConfig
from hf_clroute.bench.runners.tune import search_grid, selected
from hf_clroute.core.model import CLModel
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator
from hf_clroute.heads import (
    GRADIENT_HEAD_KINDS,
    HEAD_KINDS,
    STATISTICS_HEAD_KINDS,
    CosineClassifier,
    IncrementalClassifier,
    build_head,
    task_mask_logits,
)
from hf_clroute.methods.rwf import RwfConfig

D = tiny_vit_config().hidden_size
COSINE_ROWS = ("rwf-cosine", "l2p-cosine", "dualprompt-cosine", "coda-prompt-cosine", "rwf-head-only-cosine")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


@pytest.fixture(scope="module")
def stream():
    return class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=6,
                             test_per_class=3, name="mnist")


def tiny_vit() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config())


def fit(config, stream) -> CLModel:
    training = TrainingConfig(batch_size=6, learning_rate=1e-2, progress=False)
    model = get_cl_model(tiny_vit(), config)
    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    ContinualTrainer(model, stream, training, collator, make_accelerator(training, cpu=True)).fit()
    return model


def pixels(n: int = 3) -> dict[str, torch.Tensor]:
    cfg = tiny_vit_config()
    return {"pixel_values": torch.randn(n, cfg.num_channels, cfg.image_size, cfg.image_size,
                                        generator=torch.Generator().manual_seed(1))}


def test_logits_are_the_scaled_cosine_computed_by_hand_not_a_linear_head():
    head = build_head("cosine", D, num_classes=3, generator=torch.Generator().manual_seed(0))
    assert isinstance(head, CosineClassifier) and head.bias is None and head.num_classes == 3
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(1)) * 4
    by_hand = torch.stack([torch.stack([16.0 * torch.dot(f, w) / (f.norm() * w.norm()) for w in head.weight])
                           for f in x])
    torch.testing.assert_close(head(x), by_hand, rtol=1e-5, atol=1e-5)
    assert head(x).abs().max() <= 16.0 + 1e-4  # |cos| <= 1
    linear = IncrementalClassifier(D, 3, bias=False)
    linear.weight.data.copy_(head.weight.data)
    assert not torch.allclose(linear(x), by_hand, atol=1e-2)  # a plain linear head does not pass this test
    fixed = build_head("cosine", D, num_classes=3, scale=4.0, learn_scale=False)
    fixed.weight.data.copy_(head.weight.data)
    torch.testing.assert_close(fixed(x), by_hand / 4.0, rtol=1e-5, atol=1e-5)


def test_logits_do_not_depend_on_the_feature_norm_or_a_row_norm():
    head = build_head("cosine", D, num_classes=4)
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(2))
    scales = torch.tensor([0.01, 1.0, 3.0, 250.0, 7.0, 0.5])[:, None]
    torch.testing.assert_close(head(x * scales), head(x), rtol=1e-5, atol=1e-5)
    before = head(x)
    with torch.no_grad():
        head.weight[1] *= 40.0  # a row grown large wins nothing
    torch.testing.assert_close(head(x), before, rtol=1e-5, atol=1e-5)
    linear = IncrementalClassifier(D, 4)
    assert not torch.allclose(linear(x * scales), linear(x))


def test_the_scale_is_learned_from_its_init_or_fixed():
    learned = build_head("cosine", D, num_classes=2)
    assert learned.current_scale.item() == 16.0 and learned.settings() == {"scale": 16.0, "learn_scale": True}
    assert "log_scale_offset" in dict(learned.named_parameters())
    x, y = torch.randn(8, D), torch.tensor([0, 1] * 4)
    F.cross_entropy(learned(x), y).backward()
    assert learned.log_scale_offset.grad is not None and learned.log_scale_offset.grad.abs() > 0
    fixed = build_head("cosine", D, num_classes=2, scale=10.0, learn_scale=False)
    assert [name for name, _ in fixed.named_parameters()] == ["weight"]  # no optimizer ever sees the scale
    assert "log_scale_offset" in fixed.state_dict() and fixed.current_scale.item() == 10.0


def test_grow_keeps_old_rows_and_draws_new_rows_like_the_linear_head():
    head = build_head("cosine", D, num_classes=2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        head.weight.mul_(5.0)
        head.log_scale_offset.fill_(0.25)
    old, x = head.weight.detach().clone(), torch.randn(4, D)
    old_logits = head(x)
    head.grow(5, generator=torch.Generator().manual_seed(4))
    assert head.num_classes == 5 and torch.equal(head.weight[:2], old)
    torch.testing.assert_close(head(x)[:, :2], old_logits)  # growing alone changes no old logit
    assert head.log_scale_offset.item() == 0.25 and head.weight.requires_grad
    linear = IncrementalClassifier(D, 2, bias=False)
    linear.grow(5, generator=torch.Generator().manual_seed(4))
    assert torch.equal(head.weight[2:], linear.weight[2:])
    with pytest.raises(ValueError, match="cannot shrink"):
        head.grow(3)


def test_safetensors_round_trip_gives_identical_logits(tmp_path):
    head = build_head("cosine", D, num_classes=3)
    with torch.no_grad():
        head.log_scale_offset.fill_(-0.3)
    save_file(head.state_dict(), tmp_path / "head.safetensors")
    again = build_head("cosine", D, num_classes=0)
    again.grow(3)
    again.load_state_dict(load_file(tmp_path / "head.safetensors"))
    x = torch.randn(4, D)
    assert torch.equal(again(x), head(x))


def test_current_task_loss_leaves_old_rows_untrained_and_task_masks_apply():
    config = FinetuneConfig(freeze_backbone=True, current_task_loss=True, head="cosine")
    model = get_cl_model(tiny_vit(), config)
    model.grow_head(4)
    model.method.task_classes = [2, 3]
    out = model(**pixels(4), labels=torch.tensor([2, 3, 2, 3]))
    out.loss.backward()
    grad = model.head.weight.grad
    assert torch.all(grad[:2] == 0) and grad[2:].abs().sum() > 0
    masked = task_mask_logits(out.logits.detach(), [2, 3])
    assert torch.isinf(masked[:, :2]).all() and torch.equal(masked[:, 2:], out.logits.detach()[:, 2:])


@pytest.mark.parametrize("config", [RwfConfig(head="cosine", num_prompts=2),
                                    L2PConfig(head="cosine", pool_size=4, prompt_length=2, top_n=2)],
                         ids=["rwf", "l2p"])
def test_rwf_and_l2p_train_a_two_task_stream_on_the_cosine_head_and_reload_it(config, stream, tmp_path):
    model = fit(config, stream)
    head = model.head
    assert isinstance(head, CosineClassifier) and head.num_classes == 4
    assert head.log_scale_offset.item() != 0.0  # the learned scale trained
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "hf_clroute_config.json").read_text())
    assert saved["head"] == "cosine"
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path).eval()
    assert isinstance(loaded.head, CosineClassifier) and loaded.head.num_classes == 4
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(**pixels()).logits, model(**pixels()).logits)


def test_head_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"RwfConfig\.head must be one of .*'cosine'.*got 'cosin'"):
        RwfConfig(head="cosin")
    with pytest.raises(ValueError, match=r"L2PConfig\.head_options \(head 'cosine'\): scale must be a finite "
                                         r"number > 0, got 0"):
        L2PConfig(head="cosine", head_options={"scale": 0})
    with pytest.raises(ValueError, match=r"head_options \(head 'cosine'\): learn_scale must be true or false"):
        RwfConfig(head="cosine", head_options={"learn_scale": "yes"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) bias for head kind 'cosine'"):
        RwfConfig(head="cosine", head_options={"bias": True})
    with pytest.raises(ValueError, match=r"RwfConfig\.adaptation needs a statistics head"):
        RwfConfig(head="cosine", adaptation={"on": "first_task"})
    assert RwfConfig(head="cosine", head_options={"scale": 10, "learn_scale": False}).head == "cosine"
    assert set(GRADIENT_HEAD_KINDS) == {"linear", "cosine"}
    assert set(STATISTICS_HEAD_KINDS) == set(HEAD_KINDS) - {"linear", "cosine"}


def test_config_head_is_a_search_axis_and_the_cosine_rows_keep_their_methods_search(monkeypatch):
    suite = SuiteConfig.load("split-mnist")
    for name in COSINE_ROWS:  # each row: its method's settings and search with the cosine head
        base = method_file(name)["method"]
        run = resolve_run(suite, name, 0)
        assert run.adapter_config.head == "cosine" and run.sources["config.head"] == settings_label(settings_path(name))
        assert resolve_run(suite, base, 0).adapter_config.head == "linear"
        assert search_grid(name, trains=True) == search_grid(base, trains=True)
    others = [path.stem for folder in SETTINGS_FOLDERS for path in (CONFIG_ROOT / folder).glob("*.json")
              if path.stem not in COSINE_ROWS]  # no other row's search or settings changed
    assert not [name for name in others if '"config.head"' in json.dumps(method_search(name))
                or method_file(name).get("config", {}).get("head") == "cosine"]
    files = {"head-choice": {"method": "rwf", "search": {"config.head": ["linear", "cosine"],
                                                         "config.temperature": [0.1, 0.3]}}}
    real = method_file
    monkeypatch.setattr("hf_clroute.bench.harness.settings.method_file", lambda m: files.get(m) or real(m))
    grid = search_grid("head-choice", trains=True)
    assert {p["config.head"] for p in grid} == {"linear", "cosine"}
    config = resolve_run(suite, "head-choice", 0).adapter_config
    for point in grid:
        tuned = resolve_run(suite, "head-choice", 0, selected=selected(point, config))
        assert tuned.adapter_config.head == point["config.head"]
        assert tuned.sources["config.head"] == "selection (validation)"
