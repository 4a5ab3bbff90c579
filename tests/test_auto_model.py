"""An adapter knows its backbone: AutoCLModel loads it by repo id alone, a different one is refused,
and the Hub card carries the metadata Hub cards do."""

from __future__ import annotations

import warnings

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, hf_hub_download, metadata_load
from transformers import BertModel, ViTForImageClassification, ViTImageProcessor, ViTModel

from hf_clroute import AutoCLModel, get_cl_model
from hf_clroute.backbones.catalog import load_backbone, tiny_bert_config, tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, NCMConfig
from hf_clroute.bench.reports.cards import build_card
from hf_clroute.core.model import CLModel, backbone_fingerprint
from hf_clroute.core.model_card import minimal_card
from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import push_folder


def save_vit(path, seed: int = 0, **overrides) -> str:
    torch.manual_seed(seed)
    ViTModel(tiny_vit_config(**overrides)).save_pretrained(path)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(path)
    return str(path)


def head_trained(model: CLModel) -> CLModel:
    model.grow_head(4)
    with torch.no_grad():
        for parameter in model.trainable_parameters():
            parameter.normal_(generator=torch.Generator().manual_seed(5))
    return model.eval()


PIXELS = {"pixel_values": torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(7))}


def test_auto_model_loads_the_recorded_backbone_commit_from_the_hub(hub_server, hub_repo_id, tmp_path):
    vit_repo, adapter_repo = f"{hub_repo_id}-vit", f"{hub_repo_id}-adapter"
    push_folder(save_vit(tmp_path / "v1", seed=0), vit_repo)
    first_commit = HfApi().model_info(vit_repo).sha
    model = head_trained(get_cl_model(load_backbone(vit_repo)[0], FinetuneConfig(freeze_backbone=True)))
    assert (model.config.base_model_name_or_path, model.config.base_model_revision) == (vit_repo, first_commit)
    model.push_to_hub(adapter_repo)
    push_folder(save_vit(tmp_path / "v2", seed=1), vit_repo)  # the backbone repo moves on: same config, new weights

    loaded, processor = AutoCLModel.from_pretrained(adapter_repo, return_processor=True)
    assert isinstance(processor, ViTImageProcessor)
    assert torch.equal(loaded.eval()(**PIXELS).logits, model(**PIXELS).logits)  # the backbone at the recorded commit
    assert loaded.predict(**PIXELS) == model.predict(**PIXELS)
    # The repo's latest weights are refused (same architecture, other weights), unless asked for.
    with pytest.raises(UserInputError, match="other weights") as refused:
        CLModel.from_pretrained(load_backbone(vit_repo)[0], adapter_repo)
    assert str(refused.value).count("fingerprint w") == 2
    with pytest.warns(UserWarning, match="allow_backbone_mismatch=True"):
        latest = CLModel.from_pretrained(load_backbone(vit_repo)[0], adapter_repo, allow_backbone_mismatch=True)
    assert not torch.equal(latest(**PIXELS).logits, model(**PIXELS).logits)  # the commit is what made it identical

    card = metadata_load(hf_hub_download(adapter_repo, "README.md"))
    assert card["library_name"] == "hf_clroute" and card["base_model"] == vit_repo
    assert card["pipeline_tag"] == "image-classification"
    assert {"continual-learning", "finetune", "class-incremental", "vision", "vit"} <= set(card["tags"])


@pytest.mark.parametrize("overrides", [{"layer_norm_eps": 1e-6}, {"hidden_act": "relu"}])
def test_a_backbone_with_another_config_is_refused_naming_both(tmp_path, overrides):
    saved_on, other = save_vit(tmp_path / "a"), save_vit(tmp_path / "b", **overrides)
    head_trained(get_cl_model(load_backbone(saved_on)[0], NCMConfig())).save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match="does not match") as refused:
        CLModel.from_pretrained(load_backbone(other)[0], tmp_path / "adapter")
    fingerprints = (
        backbone_fingerprint(ViTModel(tiny_vit_config())),
        backbone_fingerprint(ViTModel(tiny_vit_config(**overrides))),
    )
    for named in (saved_on, other, *fingerprints):
        assert named in str(refused.value)


def test_same_config_under_another_name_warns_and_loads(tmp_path):
    saved_on, copy = save_vit(tmp_path / "a"), save_vit(tmp_path / "copy")
    model = head_trained(get_cl_model(load_backbone(saved_on)[0], NCMConfig()))
    model.save_pretrained(tmp_path / "adapter")
    with pytest.warns(UserWarning, match="names differ") as warned:
        CLModel.from_pretrained(load_backbone(copy)[0], tmp_path / "adapter")
    assert saved_on in str(warned[0].message) and copy in str(warned[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the recorded backbone itself, or one built in memory: nothing to say
        CLModel.from_pretrained(load_backbone(saved_on)[0], tmp_path / "adapter")
        torch.manual_seed(0)
        CLModel.from_pretrained(ViTModel(tiny_vit_config()), tmp_path / "adapter")


def test_fingerprint_ignores_where_and_how_a_backbone_was_loaded(tmp_path):
    path = save_vit(tmp_path / "a")
    loaded = ViTModel.from_pretrained(path)
    task_model = ViTForImageClassification(tiny_vit_config(num_labels=7))
    fresh = ViTModel(tiny_vit_config())
    assert backbone_fingerprint(loaded) == backbone_fingerprint(fresh) == backbone_fingerprint(task_model)
    assert backbone_fingerprint(loaded).startswith("vit:")
    bert, other_vocab = BertModel(tiny_bert_config()), BertModel(tiny_bert_config(vocab_size=101))
    assert backbone_fingerprint(bert) != backbone_fingerprint(other_vocab)


def test_auto_model_says_when_it_cannot_find_the_backbone(tmp_path):
    model = head_trained(get_cl_model(ViTModel(tiny_vit_config()), NCMConfig()))
    model.save_pretrained(tmp_path / "unnamed")
    with pytest.raises(ValueError, match="records no backbone"):
        AutoCLModel.from_pretrained(tmp_path / "unnamed")
    for name, error, message in [("pretrained-vit:mnist", UserInputError, "no committed pretrained backbone"),
                                 ("standin:vit-b16-small", UserInputError, "cannot build by name"),
                                 (str(tmp_path / "gone"), FileNotFoundError, "not on this machine")]:
        model.config.base_model_name_or_path = name
        model.save_pretrained(tmp_path / "named")
        with pytest.raises(error, match=message):
            AutoCLModel.from_pretrained(tmp_path / "named")


@pytest.mark.parametrize("backbone, pipeline_tag, modality_tag", [
    (lambda: ViTModel(tiny_vit_config()), "image-classification", "vision"),
    (lambda: BertModel(tiny_bert_config()), "text-classification", "text"),
])
def test_cards_carry_hub_metadata(backbone, pipeline_tag, modality_tag):
    config = get_cl_model(backbone(), NCMConfig(base_model_name_or_path="someone/tiny-backbone")).config
    data = ModelCard(minimal_card(config, "me/adapter")).data
    expected = ("hf_clroute", "someone/tiny-backbone", pipeline_tag)
    assert (data.library_name, data.base_model, data.pipeline_tag) == expected
    assert {"continual-learning", "ncm", modality_tag} <= set(data.tags)
    assert "AutoCLModel.from_pretrained(\"me/adapter\"" in minimal_card(config, "me/adapter")

    results = {"suite": "tiny-suite", "seeds": [0], "config": {"backbone": "pretrained-vit:mnist"},
               "methods": {"ncm": {"A_T": {"mean": 0.5, "std": 0.1}}}}
    config.base_model_name_or_path = "pretrained-vit:mnist"  # a bench alias is no Hub id: no base_model
    bench = build_card(results, "ncm", "me/adapter", config.to_dict(), plots=[]).data
    assert (bench.library_name, bench.base_model, bench.pipeline_tag) == ("hf_clroute", None, pipeline_tag)
    assert {"continual-learning", "ncm", "tiny-suite", modality_tag} <= set(bench.tags)
    assert bench.eval_results[0].task_type == pipeline_tag
