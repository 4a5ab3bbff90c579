"""Adapters through a real (local) Hub: push, load by repo id, push again, push while down."""

from __future__ import annotations

import pytest
import torch
from transformers import ViTModel

from hf_clroute import get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import FinetuneConfig
from hf_clroute.core.model import CLModel
from hf_clroute.hub.io import HubPushError


def tiny_vit(seed: int = 0) -> ViTModel:
    torch.manual_seed(seed)
    return ViTModel(tiny_vit_config())


def trained_like_model(seed: int = 0) -> CLModel:
    model = get_cl_model(tiny_vit(), FinetuneConfig(freeze_backbone=False))
    model.grow_head(4)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model.eval()


def pixels() -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(7))}


def test_push_then_from_pretrained_by_repo_id_is_identical(hub_server, hub_repo_id):
    model = trained_like_model()
    expected = model(**pixels()).logits
    model.push_to_hub(hub_repo_id)
    loaded = CLModel.from_pretrained(tiny_vit(seed=99), hub_repo_id).eval()
    assert torch.equal(loaded(**pixels()).logits, expected)


def test_push_again_updates_in_place(hub_server, hub_repo_id):
    trained_like_model(seed=0).push_to_hub(hub_repo_id)
    second = trained_like_model(seed=1)
    second.push_to_hub(hub_repo_id)
    loaded = CLModel.from_pretrained(tiny_vit(), hub_repo_id, force_download=True).eval()
    assert torch.equal(loaded(**pixels()).logits, second(**pixels()).logits)


def test_push_while_server_down_fails_clearly_and_keeps_local_files(hub_down_endpoint, hub_repo_id, tmp_path):
    model = trained_like_model()
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(HubPushError, match="local files are intact"):
        model.push_to_hub(hub_repo_id)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_config_push_and_from_pretrained_by_repo_id(hub_server, hub_repo_id):
    from hf_clroute import CLConfig
    from hf_clroute.baselines import NCMConfig

    config = NCMConfig(metric="euclidean")
    config.push_to_hub(hub_repo_id)
    assert CLConfig.from_pretrained(hub_repo_id) == config
