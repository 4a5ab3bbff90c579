"""The LoRA and prompt-tuning baselines save PEFT's own format: PEFT loads it, and so do we."""

from __future__ import annotations

import json

import pytest
import torch
from peft import AutoPeftModel, PeftModel
from safetensors import safe_open
from transformers import BertModel, GPT2LMHeadModel, ViTImageProcessor, ViTModel

from hf_clroute import AutoCLModel, get_cl_model
from hf_clroute.backbones.catalog import char_lm_config, load_backbone, tiny_bert_config, tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, LoraBaselineConfig, PromptTuningBaselineConfig
from hf_clroute.core.model import CONFIG_NAME, PEFT_WEIGHTS_NAME, WEIGHTS_NAME, CLModel, load_config


def saved_backbone(path, model_cls, config):
    torch.manual_seed(0)
    model_cls(config).save_pretrained(path)
    if model_cls is ViTModel:  # AutoCLModel loads the processor with the backbone
        ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(path)
    return str(path)


def perturbed(model: CLModel, num_classes: int = 3) -> CLModel:
    """Every trainable tensor moved off its initial value (LoRA's B starts at zero), as training would."""
    model.grow_head(num_classes)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.trainable_parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model.eval()


def assert_peft_layout(directory, peft_type, base):
    peft_config = json.loads((directory / "adapter_config.json").read_text())
    assert peft_config["peft_type"] == peft_type and peft_config["base_model_name_or_path"] == base
    assert peft_config["inference_mode"] is True
    with safe_open(str(directory / PEFT_WEIGHTS_NAME), framework="pt") as handle:
        peft_keys = set(handle.keys())
    with safe_open(str(directory / WEIGHTS_NAME), framework="pt") as handle:
        our_keys = set(handle.keys())
    assert our_keys == {"head.weight", "head.bias"}  # the head beside PEFT's tensors, never inside them
    return peft_keys


def assert_our_reload_identical(model, make_backbone, directory, inputs):
    loaded = CLModel.from_pretrained(make_backbone(), directory).eval()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
    assert load_config(directory) == model.config


def test_lora_on_vit_loads_with_peft_and_with_ours(tmp_path):
    base = saved_backbone(tmp_path / "vit", ViTModel, tiny_vit_config())
    model = perturbed(get_cl_model(ViTModel.from_pretrained(base), LoraBaselineConfig(r=2)))
    model.save_pretrained(tmp_path / "adapter")
    keys = assert_peft_layout(tmp_path / "adapter", "LORA", base)
    assert keys and all(k.startswith("base_model.model.layers.") and (".lora_A." in k or ".lora_B." in k) for k in keys)
    pixels = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))}
    with torch.no_grad():
        ours = model.extract_features(pixels)
        bare = ViTModel.from_pretrained(base)(**pixels).last_hidden_state[:, 0]
        peft = PeftModel.from_pretrained(ViTModel.from_pretrained(base), tmp_path / "adapter").eval()
        auto = AutoPeftModel.from_pretrained(tmp_path / "adapter").eval()  # the base model named in the config
        assert not torch.allclose(ours, bare)  # the adapter matters
        torch.testing.assert_close(peft(**pixels).last_hidden_state[:, 0], ours, rtol=0, atol=1e-6)
        torch.testing.assert_close(auto(**pixels).last_hidden_state[:, 0], ours, rtol=0, atol=1e-6)
    assert_our_reload_identical(model, lambda: ViTModel.from_pretrained(base), tmp_path / "adapter", pixels)
    assert torch.equal(AutoCLModel.from_pretrained(tmp_path / "adapter")(**pixels).logits, model(**pixels).logits)


def test_lora_on_a_char_lm_is_a_peft_causal_lm(tmp_path):
    lm_config = char_lm_config(40, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    base = saved_backbone(tmp_path / "lm", GPT2LMHeadModel, lm_config)
    model = perturbed(get_cl_model(GPT2LMHeadModel.from_pretrained(base), LoraBaselineConfig(r=2)))
    model.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["task_type"] == "CAUSAL_LM"
    ids = {"input_ids": torch.randint(4, 40, (2, 12), generator=torch.Generator().manual_seed(3))}
    with torch.no_grad():
        peft = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base), tmp_path / "adapter").eval()
        torch.testing.assert_close(peft(**ids).logits, model(**ids).logits, rtol=0, atol=1e-6)
    assert_our_reload_identical(model, lambda: GPT2LMHeadModel.from_pretrained(base), tmp_path / "adapter", ids)


def test_prompt_tuning_loads_with_peft_and_with_ours(tmp_path):
    base = saved_backbone(tmp_path / "bert", BertModel, tiny_bert_config())
    model = perturbed(get_cl_model(BertModel.from_pretrained(base), PromptTuningBaselineConfig(num_virtual_tokens=4)))
    model.save_pretrained(tmp_path / "adapter")
    assert assert_peft_layout(tmp_path / "adapter", "PROMPT_TUNING", base) == {"prompt_embeddings"}
    inputs = {"input_ids": torch.randint(5, 100, (2, 10), generator=torch.Generator().manual_seed(4)),
              "attention_mask": torch.tensor([[1] * 10, [1] * 7 + [0] * 3])}
    with torch.no_grad():
        peft = PeftModel.from_pretrained(BertModel.from_pretrained(base), tmp_path / "adapter").eval()
        hidden = peft(**inputs).last_hidden_state[:, 4:]  # PEFT prepends the 4 virtual tokens
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        theirs = (hidden * mask).sum(1) / mask.sum(1)  # the backbone's mean pooling over real tokens
        torch.testing.assert_close(theirs, model.method.features(model, inputs), rtol=0, atol=1e-6)
    assert_our_reload_identical(model, lambda: BertModel.from_pretrained(base), tmp_path / "adapter", inputs)


def test_peft_format_round_trips_through_the_hub(hub_server, hub_repo_id, tmp_path):
    base = saved_backbone(tmp_path / "vit", ViTModel, tiny_vit_config())
    model = perturbed(get_cl_model(ViTModel.from_pretrained(base), LoraBaselineConfig(r=2)))
    model.push_to_hub(hub_repo_id)
    pixels = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))}
    with torch.no_grad():
        assert torch.equal(AutoCLModel.from_pretrained(hub_repo_id)(**pixels).logits, model(**pixels).logits)
        peft = PeftModel.from_pretrained(ViTModel.from_pretrained(base), hub_repo_id).eval()
        torch.testing.assert_close(
            peft(**pixels).last_hidden_state[:, 0], model.extract_features(pixels), rtol=0, atol=1e-6
        )


def test_other_methods_keep_our_format_and_a_resave_drops_the_peft_files(tmp_path):
    base = saved_backbone(tmp_path / "vit", ViTModel, tiny_vit_config())
    perturbed(get_cl_model(load_backbone(base)[0], LoraBaselineConfig(r=2))).save_pretrained(tmp_path / "adapter")
    finetune = perturbed(get_cl_model(load_backbone(base)[0], FinetuneConfig()))
    finetune.save_pretrained(tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]
    assert load_config(tmp_path / "adapter") == finetune.config


def test_a_plain_peft_adapter_is_pointed_to_peft(tmp_path):
    base = saved_backbone(tmp_path / "vit", ViTModel, tiny_vit_config())
    model = get_cl_model(ViTModel.from_pretrained(base), LoraBaselineConfig(r=2))
    model.save_pretrained(tmp_path / "adapter")
    (tmp_path / "adapter" / "hf_clroute_config.json").unlink()
    with pytest.raises(ValueError, match="PEFT LORA adapter.*peft.PeftModel.from_pretrained"):
        CLModel.from_pretrained(ViTModel.from_pretrained(base), tmp_path / "adapter")
