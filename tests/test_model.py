"""The adapter API: configs, registry, get_cl_model, save/load identity, bad checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertModel, ViTForImageClassification, ViTModel

from hf_clroute import CLConfig, available_methods, get_cl_model
from hf_clroute.backbones.catalog import tiny_bert_config, tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, NCMConfig
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import CONFIG_NAME, WEIGHTS_NAME, CLModel


def tiny_vit(seed: int = 0) -> ViTModel:
    torch.manual_seed(seed)
    return ViTModel(tiny_vit_config())


def tiny_bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(tiny_bert_config())


def image_batch(n: int = 4) -> dict[str, torch.Tensor]:
    cfg = tiny_vit_config()
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(n, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)}


def text_batch() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


class _Exp:  # the two fields hooks read; a real Experience is tested in test_engine
    def __init__(self, classes):
        self.classes = classes


def test_registry_lists_baselines():
    assert {"finetune", "ncm"} <= set(available_methods())


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: FinetuneConfig(scenario="sometimes"), "scenario"),
        (lambda: NCMConfig(metric="manhattan"), "metric"),
        (lambda: NCMConfig(freeze_backbone=False), "freeze_backbone"),
    ],
)
def test_config_validation_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_config_json_round_trip_sorted_and_dispatching(tmp_path):
    config = NCMConfig(metric="euclidean", base_model_name_or_path="some/model")
    config.save_pretrained(tmp_path)
    (written,) = tmp_path.glob("*.json")  # hf_clroute_config.json (adapter_config.json before 0.2)
    text = written.read_text()
    keys = list(json.loads(text))
    assert keys == sorted(keys)
    loaded = CLConfig.from_pretrained(tmp_path)  # the base class dispatches on "method"
    assert isinstance(loaded, NCMConfig) and loaded == config


def test_config_unknown_field_and_unknown_method():
    with pytest.raises(ValueError, match="unknown field"):
        CLConfig.from_dict({"method": "ncm", "metrik": "cosine"})
    with pytest.raises(ValueError, match="registered methods"):
        CLConfig.from_dict({"method": "no-such-method"})


def test_backbone_is_frozen_and_task_model_resolves_to_base():
    torch.manual_seed(0)
    task_model = ViTForImageClassification(tiny_vit_config())
    model = get_cl_model(task_model, FinetuneConfig(freeze_backbone=True))
    assert isinstance(model.backbone, ViTModel)
    assert not any(p.requires_grad for p in model.backbone.parameters())
    model.grow_head(3)
    assert model(**image_batch()).logits.shape == (4, 3)
    counts = model.parameter_counts()
    assert counts["trainable_params"] == 3 * (tiny_vit_config().hidden_size + 1)


@pytest.mark.parametrize("backbone_fn, batch_fn", [(tiny_vit, image_batch), (tiny_bert, text_batch)])
def test_finetune_save_load_bit_identical(tmp_path, backbone_fn, batch_fn):
    model = get_cl_model(backbone_fn(), FinetuneConfig())
    model.grow_head(5)
    with torch.no_grad():  # move every weight away from its init so identity is not by accident
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.eval()
    expected = model(**batch_fn()).logits
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(backbone_fn(seed=123), tmp_path).eval()
    assert torch.equal(loaded(**batch_fn()).logits, expected)


def test_ncm_save_load_keeps_statistics(tmp_path):
    model = get_cl_model(tiny_vit(), NCMConfig())
    ctx = StepContext(task_id=0)
    model.grow_head(3)
    model.begin_task(_Exp([0, 1, 2]), ctx)
    batch = image_batch(6)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        out = model(**batch)
    model.after_step({**batch, "labels": labels}, out, ctx)
    model.before_evaluation(ctx)
    expected = model(**batch).logits
    assert torch.isfinite(expected).all()
    model.save_pretrained(tmp_path)
    # Only the prototype head's statistics are saved: the frozen backbone stays where it came from.
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / WEIGHTS_NAME)))
    assert keys == {"head.counts", "head.sums", "head.means"}
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path)
    assert torch.equal(loaded(**batch).logits, expected)


def _saved_finetune(tmp_path):
    model = get_cl_model(tiny_vit(), FinetuneConfig(freeze_backbone=True))
    model.grow_head(2)
    model.save_pretrained(tmp_path)
    return tmp_path / WEIGHTS_NAME


def test_corrupted_checkpoint_is_refused(tmp_path):
    weights = _saved_finetune(tmp_path)
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # flip bits inside the tensor data: safetensors itself would not notice
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted adapter checkpoint"):
        CLModel.from_pretrained(tiny_vit(), tmp_path)


def test_truncated_checkpoint_is_refused(tmp_path):
    weights = _saved_finetune(tmp_path)
    weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(ValueError, match="corrupted adapter checkpoint"):
        CLModel.from_pretrained(tiny_vit(), tmp_path)


def test_pickle_checkpoint_is_refused(tmp_path):
    weights = _saved_finetune(tmp_path)
    weights.unlink()
    torch.save({"x": torch.zeros(1)}, tmp_path / "adapter_model.bin")
    with pytest.raises(ValueError, match="refuses to load pickles"):
        CLModel.from_pretrained(tiny_vit(), tmp_path)


def test_mismatched_backbone_is_reported(tmp_path):
    _saved_finetune(tmp_path)
    wider = ViTModel(tiny_vit_config(hidden_size=48, intermediate_size=96))
    with pytest.raises(ValueError, match="does not match"):
        CLModel.from_pretrained(wider, tmp_path)


def test_unsupported_modality_for_method():
    from transformers import GPT2LMHeadModel

    from hf_clroute.backbones.catalog import char_lm_config

    with pytest.raises(ValueError, match="supports"):
        get_cl_model(GPT2LMHeadModel(char_lm_config(vocab_size=40, n_layer=2, n_embd=32, n_head=2)), NCMConfig())


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    _saved_finetune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]
