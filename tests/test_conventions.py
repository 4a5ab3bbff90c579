"""Loading and saving like transformers and PEFT (issue 34, items 1-4 and the card/asset part of 8).

1. Every adapter the library writes loads with ``AutoCLModel.from_pretrained`` alone: a bench run on the
   committed ``pretrained-vit:<name>`` (the demo's backbone), and its push to the local Hub.
2. Our own file names; adapters saved the old way still load; transformers and PEFT never take ours for theirs.
3. Eval mode and a frozen adapter on load (``is_trainable=True`` trains on); transformers' ``save_pretrained``
   signature; ``push_to_hub(revision=, create_pr=)``; the PEFT class that loads prompt tuning.
4. A weights fingerprint: a same-shape backbone with other weights is refused naming both fingerprints.
5. Hub calls: not found, a garbage answer and a server that never answers, each one line naming repo and server.
6. Cards carry license, datasets, build commit and versions; a cached backbone is re-verified.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from transformers import BertModel, ViTImageProcessor, ViTModel

from hf_clroute import AutoCLModel, get_cl_model
from hf_clroute.backbones.assets import asset_revision
from hf_clroute.backbones.catalog import load_backbone, tiny_bert_config, tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, NCMConfig, PromptTuningBaselineConfig
from hf_clroute.cli import main
from hf_clroute.core.model import CONFIG_NAME, WEIGHTS_NAME, CLModel, backbone_fingerprint
from hf_clroute.core.model_card import minimal_card
from hf_clroute.errors import HubError, UserInputError
from hf_clroute.hub.io import PEFT_CONFIG_NAME, PEFT_WEIGHTS_NAME, HubPushError

ASSET = "pretrained-vit:vit-mnist-stream"
PIXELS = {"pixel_values": torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(7))}


def tiny_vit(seed: int = 0) -> ViTModel:
    torch.manual_seed(seed)
    return ViTModel(tiny_vit_config())


def save_vit(path, seed: int = 0) -> str:
    tiny_vit(seed).save_pretrained(path)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(path)
    return str(path)


def head_trained(model: CLModel, classes: int = 4) -> CLModel:
    model.grow_head(classes)
    with torch.no_grad():
        for parameter in model.trainable_parameters():
            parameter.normal_(generator=torch.Generator().manual_seed(5))
    return model.eval()


# ---- 1. every adapter the library writes loads by its directory or repo id alone ----------------
@pytest.fixture(scope="module")
def asset_run(tmp_path_factory):
    """The demo at a tiny size: `hf-clroute bench` on split-mnist's committed ViT (2 tasks, 8 images a class)."""
    root = tmp_path_factory.mktemp("asset_run")
    suite = {"base": "split-mnist", "name": "tiny-split-mnist", "n_tasks": 2, "max_classes": 4, "train_per_class": 8,
             "test_per_class": 4, "validation_per_class": 0, "methods": ["finetune", "ncm"], "probe_forgetting": False,
             "training": {"batch_size": 8, "evals_per_task": 1}}
    (root / "suite.json").write_text(json.dumps(suite))
    assert main(["bench", "--suite", str(root / "suite.json"), "--seeds", "0", "--out", str(root / "run"),
                 "--no-progress"]) == 0
    return root


def _suite_predictions(model, suite_file):
    from hf_clroute.bench.harness.suites import SuiteConfig, build_stream, load_suite_backbone

    suite = SuiteConfig.load(str(suite_file))
    _, collator = load_suite_backbone(suite)
    batch = collator([build_stream(suite, 0)[0].test[i] for i in range(4)])
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def test_a_bench_adapter_on_the_committed_vit_loads_by_its_directory_alone(asset_run, tmp_path, monkeypatch):
    from hf_clroute.bench.harness.suites import SuiteConfig, load_suite_backbone

    adapter = asset_run / "run" / "adapters" / "finetune"
    config = json.loads((adapter / CONFIG_NAME).read_text())
    # The backbone's identity: the committed asset's stable name and the sha256 of its weights.
    assert config["base_model_name_or_path"] == ASSET
    revision = config["base_model_revision"]
    assert revision == asset_revision(ASSET) and revision.startswith("sha256:")
    expected = CLModel.from_pretrained(load_suite_backbone(SuiteConfig.load(str(asset_run / "suite.json")))[0], adapter)
    # A fresh cache: the asset is installed on the way.
    monkeypatch.setenv("HF_CLROUTE_CACHE", str(tmp_path / "cache"))
    model, processor = AutoCLModel.from_pretrained(adapter, return_processor=True)
    assert (tmp_path / "cache" / "models" / "vit-mnist-stream" / "model.safetensors").is_file()
    assert type(processor).__name__.startswith("ViTImageProcessor")
    assert torch.equal(_suite_predictions(model, asset_run / "suite.json"),
                       _suite_predictions(expected, asset_run / "suite.json"))
    assert isinstance(AutoCLModel.from_pretrained(asset_run / "run" / "adapters" / "ncm"), CLModel)


def test_a_pushed_bench_adapter_loads_by_its_repo_id_alone(asset_run, hub_server, hub_repo_id):
    assert main(["push", str(asset_run / "run"), "--repo-id", hub_repo_id, "--method", "ncm"]) == 0
    local = AutoCLModel.from_pretrained(asset_run / "run" / "adapters" / "ncm")
    remote = AutoCLModel.from_pretrained(hub_repo_id)
    assert torch.equal(_suite_predictions(remote, asset_run / "suite.json"),
                       _suite_predictions(local, asset_run / "suite.json"))
    card = ModelCard.load(hf_hub_download(hub_repo_id, "README.md"))  # item 6: the bench card
    assert card.data.license == "apache-2.0"
    assert {"ylecun/mnist", "zalando-datasets/fashion_mnist"} <= set(card.data.datasets)  # stream + pretraining data
    assert "cc-by-sa-3.0" in card.text and "hf_clroute commit" in card.text and "transformers " in card.text
    assert f'AutoCLModel.from_pretrained("{hub_repo_id}"' in card.text


def test_a_mismatch_found_by_auto_model_does_not_recommend_auto_model(tmp_path):
    saved_on = save_vit(tmp_path / "vit", seed=0)
    head_trained(get_cl_model(load_backbone(saved_on)[0], NCMConfig())).save_pretrained(tmp_path / "adapter")
    save_vit(tmp_path / "vit", seed=1)  # the recorded directory now holds other weights
    with pytest.raises(UserInputError, match="other weights") as refused:
        AutoCLModel.from_pretrained(tmp_path / "adapter")
    assert "AutoCLModel" not in str(refused.value) and "allow_backbone_mismatch=True" in str(refused.value)


# ---- 2. our own file names; the old layout still loads -----------------------------------------
def test_our_format_has_our_names_and_the_old_layout_still_loads(tmp_path):
    model = head_trained(get_cl_model(tiny_vit(), NCMConfig()))
    model.save_pretrained(tmp_path / "new")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]
    # An adapter written before 0.2: our config and weights under PEFT's names, no peft_type.
    old = tmp_path / "old"
    old.mkdir()
    config = json.loads((tmp_path / "new" / CONFIG_NAME).read_text())
    config["base_model_fingerprint"] = backbone_fingerprint(tiny_vit())  # no weights part back then
    (old / PEFT_CONFIG_NAME).write_text(json.dumps(config))
    shutil.copy(tmp_path / "new" / WEIGHTS_NAME, old / PEFT_WEIGHTS_NAME)
    with pytest.warns(UserWarning, match="records no weights fingerprint"):
        loaded = CLModel.from_pretrained(tiny_vit(), old)
    assert torch.equal(loaded(**PIXELS).logits, model(**PIXELS).logits)
    loaded.save_pretrained(old)  # a re-save moves it to our names
    assert sorted(p.name for p in old.iterdir()) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]


def test_transformers_and_peft_do_not_take_our_directory_for_theirs(tmp_path):
    """No config.json stub: transformers would build a half model from it. Its own error names the file it
    looks for (the card says to use AutoCLModel); PEFT finds no adapter_config.json to half-read."""
    from peft import PeftConfig
    from transformers import AutoModel

    head_trained(get_cl_model(tiny_vit(), NCMConfig())).save_pretrained(tmp_path)
    with pytest.raises((OSError, ValueError), match="config.json"):
        AutoModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="adapter_config.json"):
        PeftConfig.from_pretrained(tmp_path)
    assert "AutoCLModel" in minimal_card(get_cl_model(tiny_vit(), NCMConfig()).config, "me/x")


# ---- 3. transformers/PEFT habits ---------------------------------------------------------------------
def test_loading_gives_eval_mode_and_a_frozen_adapter_unless_trainable(tmp_path):
    head_trained(get_cl_model(tiny_vit(), FinetuneConfig(freeze_backbone=False))).save_pretrained(tmp_path)
    frozen = CLModel.from_pretrained(tiny_vit(), tmp_path)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
    trainable = CLModel.from_pretrained(tiny_vit(), tmp_path, is_trainable=True)
    assert trainable.training and trainable.head.weight.requires_grad
    assert all(p.requires_grad for p in trainable.backbone.parameters())  # finetune trains the backbone


def test_save_pretrained_takes_transformers_arguments(tmp_path):
    model = head_trained(get_cl_model(tiny_vit(), NCMConfig()))
    model.save_pretrained(tmp_path / "other-rank", is_main_process=False)
    assert not (tmp_path / "other-rank").exists()
    with pytest.raises(UserInputError, match="safetensors only"):
        model.save_pretrained(tmp_path / "pickle", safe_serialization=False)
    model.save_pretrained(tmp_path / "kw", max_shard_size="5GB", variant=None, token=None)
    assert (tmp_path / "kw" / WEIGHTS_NAME).is_file()


def test_push_to_hub_takes_a_branch_and_opens_a_pull_request(hub_server, hub_repo_id):
    first = head_trained(get_cl_model(tiny_vit(), NCMConfig()))
    first.push_to_hub(hub_repo_id)
    second = head_trained(get_cl_model(tiny_vit(), NCMConfig()), classes=6)
    second.push_to_hub(hub_repo_id, revision="experiment")  # a new branch, created from main
    assert HfApi().repo_info(hub_repo_id, revision="experiment").sha != HfApi().repo_info(hub_repo_id).sha
    on_branch = CLModel.from_pretrained(tiny_vit(), hub_repo_id, revision="experiment")
    assert on_branch.head.num_classes == 6
    assert CLModel.from_pretrained(tiny_vit(), hub_repo_id).head.num_classes == 4  # main is untouched
    url = second.push_to_hub(hub_repo_id, create_pr=True)
    assert "/discussions/" in url
    assert CLModel.from_pretrained(tiny_vit(), hub_repo_id, revision="refs/pr/1").head.num_classes == 6


def test_prompt_tuning_loads_with_the_peft_auto_class_its_card_names(tmp_path):
    from peft import AutoPeftModel, AutoPeftModelForFeatureExtraction

    torch.manual_seed(0)
    BertModel(tiny_bert_config()).save_pretrained(tmp_path / "bert")
    model = get_cl_model(BertModel.from_pretrained(tmp_path / "bert"), PromptTuningBaselineConfig(num_virtual_tokens=4))
    model.save_pretrained(tmp_path / "adapter")
    peft = AutoPeftModelForFeatureExtraction.from_pretrained(tmp_path / "adapter")
    assert peft.peft_config["default"].peft_type.value == "PROMPT_TUNING"
    with pytest.raises(ValueError, match="task"):  # PEFT's own rule: a task type needs its task's class
        AutoPeftModel.from_pretrained(tmp_path / "adapter")
    card = minimal_card(model.config, "me/pt", peft_format="AutoPeftModelForFeatureExtraction")
    assert "AutoPeftModelForFeatureExtraction" in card


# ---- 4. a weights fingerprint ------------------------------------------------------------------------
def test_a_same_shape_backbone_with_other_weights_is_refused_naming_both_fingerprints(tmp_path):
    model = head_trained(get_cl_model(tiny_vit(seed=0), NCMConfig()))
    model.save_pretrained(tmp_path)
    recorded = model.config.base_model_fingerprint
    assert recorded.startswith(backbone_fingerprint(tiny_vit()) + ":w")
    with pytest.raises(UserInputError) as refused:
        CLModel.from_pretrained(tiny_vit(seed=1), tmp_path)
    other = get_cl_model(tiny_vit(seed=1), NCMConfig()).config.base_model_fingerprint
    assert recorded.split(":")[2] in str(refused.value) and other.split(":")[2] in str(refused.value)
    with pytest.warns(UserWarning, match="other weights"):
        CLModel.from_pretrained(tiny_vit(seed=1), tmp_path, allow_backbone_mismatch=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same weights in bfloat16: the same backbone
        CLModel.from_pretrained(tiny_vit(seed=0).to(torch.bfloat16), tmp_path)


def test_the_cli_refuses_an_adapter_on_other_weights(tiny_suite, tmp_path, capsys):
    """`evaluate` on a same-shape backbone with other weights: one line and exit 2, not chance scored silently."""
    suite = json.loads(tiny_suite.read_text())
    model = head_trained(get_cl_model(load_backbone(suite["backbone"])[0], NCMConfig()))
    model.save_pretrained(tmp_path / "adapter")
    other = dict(suite, backbone=save_vit(tmp_path / "other-vit", seed=3))
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["evaluate", "--adapter", str(tmp_path / "adapter"), "--suite", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "other weights" in err and "Traceback" not in err
    # the explicit override scores it (with a warning), exit 0
    with pytest.warns(UserWarning, match="other weights"):
        assert main(["evaluate", "--adapter", str(tmp_path / "adapter"), "--suite", str(tmp_path / "other.json"),
                     "--allow-backbone-mismatch"]) == 0


def test_continuing_an_adapter_from_the_bench_trains_it(tmp_path):
    """`--from-adapter` loads with is_trainable=True: a frozen reload would continue training nothing."""
    from hf_clroute.bench.harness.suites import SuiteConfig
    from hf_clroute.bench.runners.classification import load_adapter_to_continue

    model = head_trained(get_cl_model(tiny_vit(seed=0), FinetuneConfig()))
    model.save_pretrained(tmp_path)
    suite = SuiteConfig(name="t", dataset="mnist", backbone=model.config.base_model_name_or_path or "x")
    continued = load_adapter_to_continue(tiny_vit(seed=0), str(tmp_path), suite)
    assert continued.training and any(p.requires_grad for p in continued.parameters())


# ---- 5. Hub calls: a deadline, and errors naming the repo and the server --------------------------------
def test_hub_errors_name_the_repo_and_the_server(hub_server, hub_repo_id, tmp_path, monkeypatch):
    with pytest.raises(HubError, match=f"adapter 'tester/does-not-exist' not found on {hub_server.url}$"):
        AutoCLModel.from_pretrained("tester/does-not-exist")
    model = head_trained(get_cl_model(tiny_vit(), NCMConfig()))
    model.push_to_hub(hub_repo_id)
    with hub_server.faulty("garbage"):
        with pytest.raises(HubError, match=f"the Hub at {hub_server.url} answered .*not JSON"):
            CLModel.from_pretrained(tiny_vit(), hub_repo_id, force_download=True)
    monkeypatch.setenv("HF_CLROUTE_HUB_TIMEOUT", "1.5")
    with hub_server.faulty("hang"):
        refusal = f"the Hub at {hub_server.url} did not answer within 1.5 s .*HF_CLROUTE_HUB_TIMEOUT"
        with pytest.raises(HubError, match=refusal):
            CLModel.from_pretrained(tiny_vit(), hub_repo_id, force_download=True)
        with pytest.raises(HubPushError, match="did not answer within 1.5 s.*local files are intact"):
            model.push_to_hub(hub_repo_id)
    monkeypatch.setenv("HF_CLROUTE_HUB_TIMEOUT", "soon")
    with pytest.raises(UserInputError, match="HF_CLROUTE_HUB_TIMEOUT='soon'"):
        model.push_to_hub(hub_repo_id)


# ---- 6. cards and the committed backbones ------------------------------------------------------------
def test_the_minimal_card_carries_license_datasets_commit_and_versions():
    config = get_cl_model(tiny_vit(), NCMConfig(base_model_name_or_path=ASSET)).config
    card = ModelCard(minimal_card(config, "me/adapter", datasets=["mnist"]))
    assert card.data.license == "apache-2.0" and card.data.library_name == "hf_clroute"
    assert card.data.datasets == ["ylecun/mnist", "zalando-datasets/fashion_mnist"]
    for text in ("cc-by-sa-3.0", "license mit", "Built from", "torch ", "transformers ", "peft ", "hf_clroute "):
        assert text in card.text, text
    assert 'AutoCLModel.from_pretrained("me/adapter"' in card.text  # a package backbone name loads by itself


def test_a_cached_backbone_that_differs_from_the_committed_asset_is_replaced(tmp_path, monkeypatch):
    from hf_clroute.backbones.catalog import resolve_backbone_name

    monkeypatch.setenv("HF_CLROUTE_CACHE", str(tmp_path))
    path = resolve_backbone_name(ASSET)
    good = (tmp_path / "models" / "vit-mnist-stream" / "config.json").read_bytes()
    config = json.loads(good)
    changed = {**config, "hidden_dropout_prob": 0.5}
    (tmp_path / "models" / "vit-mnist-stream" / "config.json").write_text(json.dumps(changed))
    with pytest.warns(UserWarning, match=r"differs from the committed asset .*config\.json"):
        assert resolve_backbone_name(ASSET) == path
    assert (tmp_path / "models" / "vit-mnist-stream" / "config.json").read_bytes() == good
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # verified once: no second look, no warning
        resolve_backbone_name(ASSET)
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["vit-mnist-stream"]  # no stale copy left beside it


def test_a_concurrent_install_keeps_the_copy_another_process_installed(tmp_path, monkeypatch):
    """Two processes on a fresh cache both install the asset; the one that finishes second must not
    rename away the copy the first one installed (and may already be loading)."""
    from hf_clroute.backbones import assets

    asset = assets.committed_asset("vit-mnist-stream")
    final = tmp_path / "models" / "vit-mnist-stream"
    install = assets.install_asset

    def racing_install(source, out):
        install(source, out)
        if not final.exists():  # the other process wins the race while this one copies
            final.mkdir()
            install(source, final)
            final.joinpath("marker").write_text("first")  # not in SHA256SUMS: checksums ignore it

    monkeypatch.setattr(assets, "install_asset", racing_install)
    assert assets.installed_asset_path(asset, final) == final
    assert final.joinpath("marker").read_text() == "first"  # the winner's copy was never replaced
    assert [p.name for p in final.parent.iterdir()] == ["vit-mnist-stream"]  # no temporary copy left
