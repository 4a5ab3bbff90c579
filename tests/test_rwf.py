"""RwF: Hopfield routing prompts on ViT, BERT and the GPT-2 char-LM.

Tiny backbones are built in code; the MiniLM test reads the real pretrained
checkpoint shipped as a pip package; the engine test reads real MNIST.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import BertModel, GPT2LMHeadModel, ViTConfig, ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import (
    char_lm_config,
    get_blocks,
    load_backbone,
    offline_model_path,
    tiny_bert_config,
    tiny_vit_config,
)
from hf_clroute.baselines.finetune import FinetuneConfig
from hf_clroute.bench.harness.settings import resolve_run
from hf_clroute.bench.harness.suites import SuiteConfig
from hf_clroute.core.model import CLModel
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import Callback, make_accelerator
from hf_clroute.methods.rwf import HopfieldRouter, RoutedAttention, RwfConfig

SETTINGS = Path(__file__).resolve().parents[1] / "hf_clroute" / "bench" / "configs" / "methods"

ATTN = ("sdpa", "eager")


# ---------------------------------------------------------------------------- helpers


def tiny_vit(attn: str = "sdpa") -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config(attn_implementation=attn)).eval()


def tiny_bert(attn: str = "sdpa") -> BertModel:
    torch.manual_seed(0)
    return BertModel(tiny_bert_config(attn_implementation=attn)).eval()


def tiny_lm(attn: str = "sdpa") -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = char_lm_config(40, n_embd=32, n_layer=2, n_head=2, n_positions=64, attn_implementation=attn)
    return GPT2LMHeadModel(config).eval()


def pixels(n: int = 3) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(1))}


def padded_text() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 10, 3, 0, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def lm_ids(n: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(4, 40, (n, length), generator=torch.Generator().manual_seed(2))


def perturb_trainable(model: CLModel, scale: float = 0.1) -> None:
    """Move every trained tensor away from its init, so identities are not by accident."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def capture_attention_lengths(model: CLModel) -> list[tuple[int, int]]:
    """(rows into, rows out of) every wrapped attention, recorded by forward hooks."""
    seen: list[tuple[int, int]] = []
    for module in model.modules():
        if isinstance(module, RoutedAttention):
            module.base_layer.register_forward_hook(
                lambda m, args, kwargs, out: seen.append((args[0].shape[1], out[0].shape[1])), with_kwargs=True
            )
    return seen


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_prompts": 0}, "num_prompts"),
        ({"beta": -1.0, "routing": "dot"}, "beta"),
        ({"beta": 0.5}, "beta"),  # beta is the dot routing's; cosine routing has a temperature
        ({"beta_scale": 0.0, "routing": "dot"}, "beta_scale"),
        ({"beta_scale": 0.5}, "beta_scale"),  # cosine routing: no beta to scale
        ({"beta_scale": 0.5, "beta": 0.1, "routing": "dot"}, "beta_scale"),  # one or the other
        ({"routing": "l2"}, "routing"),
        ({"temperature": 0.0}, "temperature"),
        ({"train_routers_for_tasks": -1}, "train_routers_for_tasks"),
        ({"head_refresh_steps": 0}, "head_refresh_steps"),
        ({"routed_layers": [0, 0]}, "routed_layers"),
        ({"routed_layers": []}, "routed_layers"),
        ({"query_mode": "dynamic"}, "query_mode"),
        ({"key_init": "block"}, "key_init"),
        ({"value_init": "random"}, "value_init"),
        ({"query_projection_init": "xavier"}, "query_projection_init"),
        ({"causal_chunk_size": 0}, "causal_chunk_size"),
        ({"freeze_backbone": False}, "freeze_backbone"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RwfConfig(**kwargs)


def test_default_routes_first_three_blocks_and_out_of_range_is_refused():
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config(num_hidden_layers=4)), RwfConfig())
    routed = [i for i, b in enumerate(get_blocks(model.backbone)) if isinstance(b.attention, RoutedAttention)]
    assert routed == [0, 1, 2] and sorted(model.method.routers) == ["0", "1", "2"]
    with pytest.raises(ValueError, match="routed_layers"):
        get_cl_model(tiny_vit(), RwfConfig(routed_layers=[5]))


# ---------------------------------------------------------------------------- injection


@pytest.mark.parametrize("attn", ATTN)
def test_vit_prompts_added_then_dropped(attn):
    bare = tiny_vit(attn)(**pixels()).last_hidden_state
    model = get_cl_model(tiny_vit(attn), RwfConfig(num_prompts=5)).eval()
    lengths = capture_attention_lengths(model)
    routed = model.backbone(**pixels()).last_hidden_state
    tokens = bare.shape[1]
    assert routed.shape == bare.shape
    assert lengths == [(tokens + 5, tokens + 5)] * 2  # both blocks saw L + m rows ...
    assert not torch.allclose(routed, bare)  # ... and the prompts changed what the tokens attended to
    model.grow_head(4)
    assert model(**pixels()).logits.shape == (3, 4)


def test_vit_sdpa_and_eager_agree():
    out = {
        attn: get_cl_model(tiny_vit(attn), RwfConfig(num_prompts=5)).backbone(**pixels()).last_hidden_state
        for attn in ATTN
    }
    torch.testing.assert_close(out["sdpa"], out["eager"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ATTN)
def test_bert_with_padding_shapes_and_pad_tokens_are_ignored(attn):
    batch = padded_text()
    bare = tiny_bert(attn)(**batch).last_hidden_state
    model = get_cl_model(tiny_bert(attn), RwfConfig(num_prompts=3)).eval()
    lengths = capture_attention_lengths(model)
    out = model.backbone(**batch).last_hidden_state
    assert out.shape == bare.shape and lengths == [(6 + 3, 6 + 3)] * 2
    # What sits under the padding must not reach real tokens: neither through the
    # attention (extended mask) nor through the routing (pads get no routing weight).
    other = dict(batch, input_ids=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 17))
    out_other = model.backbone(**other).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out_other[real], out[real], atol=1e-6, rtol=1e-6)
    # The padded sequence gives the same features as the same sentence alone.
    alone = model.backbone(input_ids=batch["input_ids"][1:, :4]).last_hidden_state
    torch.testing.assert_close(out[1, :4], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("chunk", [1, 4])
def test_causal_lm_routing_never_sees_the_future(attn, chunk):
    ids = lm_ids()
    bare = tiny_lm(attn)(input_ids=ids).logits
    model = get_cl_model(tiny_lm(attn), RwfConfig(num_prompts=3, causal_chunk_size=chunk)).eval()
    perturb_trainable(model, 1.0)
    lengths = capture_attention_lengths(model)
    logits = model(input_ids=ids).logits
    groups = -(-ids.shape[1] // chunk)
    assert logits.shape == bare.shape and lengths[0] == (12 + groups * 3,) * 2
    assert not torch.allclose(logits, bare, atol=1e-4)  # the routing does act
    for t in (0, 4, 7, 10):
        changed = ids.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 7) % 36 + 4
        new = model(input_ids=changed).logits
        torch.testing.assert_close(new[:, : t + 1], logits[:, : t + 1], atol=1e-6, rtol=1e-6)
        assert (new[:, t + 1] - logits[:, t + 1]).abs().max() > 1e-3


@pytest.mark.parametrize("attn", ATTN)
def test_causal_lm_left_padding_is_ignored(attn):
    # Chunk 1: every position has its own prompts, so left padding shifts nothing.
    model = get_cl_model(tiny_lm(attn), RwfConfig(num_prompts=3, causal_chunk_size=1)).eval()
    perturb_trainable(model, 1.0)
    ids = lm_ids(1, 8)
    alone = model(input_ids=ids).logits
    padded_ids = torch.cat([torch.full((1, 3), 9), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], dim=1)
    position_ids = torch.clamp(mask.cumsum(1) - 1, min=0)
    padded = model(input_ids=padded_ids, attention_mask=mask, position_ids=position_ids).logits
    torch.testing.assert_close(padded[:, 3:], alone, atol=1e-5, rtol=1e-5)


def test_causal_lm_generates_and_refuses_a_stale_cache():
    model = get_cl_model(tiny_lm(), RwfConfig(num_prompts=2, causal_chunk_size=1)).eval()
    ids = lm_ids(1, 5)
    out = model.backbone.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 9)
    # Greedy decoding without a cache equals the argmax of a full forward at every step.
    logits = model(input_ids=out[:, :-1]).logits
    assert torch.equal(logits[0, 4:].argmax(-1), out[0, 5:])
    with pytest.raises(NotImplementedError, match="use_cache=False"):
        model.backbone.generate(input_ids=ids, max_new_tokens=2, do_sample=False, use_cache=True)


# ---------------------------------------------------------------------------- the router


def router_and_tokens(**overrides) -> tuple[HopfieldRouter, torch.Tensor]:
    config = RwfConfig(
        **{"num_prompts": 4, "key_init": "orthogonal", "value_init": "orthogonal", "routing": "dot", **overrides}
    )
    router = HopfieldRouter(16, config, seed=5).double()
    tokens = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return router, tokens


def free_energy(p: torch.Tensor, scores: torch.Tensor, beta: float) -> torch.Tensor:
    """F(p; q) = -sum_i p_i <q, k_i> + beta^-1 sum_i p_i log p_i (0 log 0 = 0)."""
    return -(p * scores).sum(-1) + (p * torch.log(p.clamp_min(1e-300))).sum(-1) / beta


def test_routing_is_the_free_energy_minimiser():
    router, tokens = router_and_tokens(beta=0.7)
    with torch.no_grad():
        weights = router.routing_weights(tokens)[:, 0]  # (B, m, L)
        scores = torch.einsum("md,bld->bml", router.query(), tokens @ router.key_weight)  # <q, k_i>
    # Mirror descent (entropic) on the simplex, from the uniform point, knows nothing of softmax.
    p = torch.full_like(scores, 1.0 / scores.shape[-1])
    step = 0.5 * router.beta
    for _ in range(200):
        grad = -scores + (torch.log(p) + 1) / router.beta
        p = p * torch.exp(-step * (grad - grad.amax(-1, keepdim=True)))
        p = p / p.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, p, atol=1e-10, rtol=1e-8)
    # And no other point of the simplex has lower free energy.
    g = torch.Generator().manual_seed(6)
    best = free_energy(weights, scores, router.beta)
    for _ in range(20):
        noise = torch.randn(weights.shape, generator=g, dtype=torch.float64)
        other = torch.softmax(torch.log(weights) + 0.3 * noise, -1)
        assert (free_energy(other, scores, router.beta) > best).all()


def test_padding_gets_no_routing_weight_and_causal_groups_see_no_future():
    router, tokens = router_and_tokens()
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False
    with torch.no_grad():
        weights = router.routing_weights(tokens, valid)
        causal = router.routing_weights(tokens, valid, chunk_size=3)  # groups start at 0, 3, 6
    assert (weights[1, ..., 6:] == 0).all() and torch.allclose(weights.sum(-1), torch.ones(()).double())
    positions = torch.arange(9)
    for g, start in enumerate((0, 3, 6)):
        assert (causal[:, g, :, positions > start] == 0).all()
    # A group whose visible tokens are all padding routes nothing, without NaN.
    left = torch.ones(2, 9, dtype=torch.bool)
    left[:, :4] = False
    prompts, prompt_valid = router(tokens, left, chunk_size=3)
    assert torch.isfinite(prompts).all() and prompt_valid.view(2, 3, 4)[:, :2].logical_not().all()
    assert (prompts.view(2, 3, 4, 16)[:, :2] == 0).all() and prompt_valid.view(2, 3, 4)[:, 2].all()


def test_routing_is_lipschitz_in_the_tokens():
    router, tokens = router_and_tokens(beta=0.5)
    with torch.no_grad():
        q_norm = router.query().norm(dim=-1)  # (m,)
        w_k = torch.linalg.matrix_norm(router.key_weight, ord=2)
        direction = torch.randn(tokens.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        direction = direction / direction.norm()
        base_w = router.routing_weights(tokens)[:, 0]
        base_p, _ = router(tokens)
        ratios = []
        for eps in (1e-1, 1e-2, 1e-3, 1e-4):
            moved = tokens + eps * direction
            dw = (router.routing_weights(moved)[:, 0] - base_w).norm(dim=-1)  # (B, m)
            # softmax is 1-Lipschitz: |dA_a| <= beta |q_a| |W_K|_2 |dZ|
            dz = (eps * direction).norm(dim=(1, 2))[:, None]
            assert (dw <= router.beta * q_norm * w_k * dz + 1e-12).all()
            ratios.append(((router(moved)[0] - base_p).norm() / eps).item())
    # The prompts change in proportion to the input change (no jumps, as argmax/top-k routing would have).
    assert max(ratios[1:]) / min(ratios[1:]) < 1.02 and ratios[-1] < 100


# ---------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def stream():
    return class_incremental(
        load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=16, test_per_class=8,
        name="mnist",
    )


def test_engine_trains_only_the_query_side_and_frozen_projections_stay(stream):
    model = get_cl_model(tiny_vit(), RwfConfig(num_prompts=4, key_init="orthogonal", value_init="orthogonal"))
    routers = model.method.routers.values()
    frozen = {n: t.clone() for n, t in model.named_buffers() if n.endswith(("key_weight", "value_weight"))}
    backbone_before = {n: p.clone() for n, p in model.backbone.named_parameters()}
    queries_before = [r.query().detach().clone() for r in routers]
    trainable = {id(p) for p in model.trainable_parameters()}
    expected = {id(p) for r in routers for p in (r.queries, r.query_proj.weight, r.query_proj.bias)}
    assert trainable == expected | {id(p) for p in model.head.parameters()}

    config = TrainingConfig(batch_size=8, learning_rate=1e-2, progress=False)
    collate = ImageCollator(16, num_channels=3)
    result = ContinualTrainer(model, stream, config, collate, make_accelerator(config, cpu=True)).fit()
    assert len(result.accuracy_matrix) == 2 and result.finished
    assert len(frozen) == 4 and all(torch.equal(dict(model.named_buffers())[n], t) for n, t in frozen.items())
    assert all(r.key_weight.grad is None and not r.key_weight.requires_grad for r in routers)
    assert all(torch.equal(p, backbone_before[n]) for n, p in model.backbone.named_parameters())
    assert all(not torch.equal(r.query().detach(), q) for r, q in zip(routers, queries_before))
    # Trainable = query side + head, counted against the backbone.
    d = 32
    assert result.params["trainable_params"] == 2 * (4 * d + d * d + d) + 4 * (d + 1)


def test_frozen_projections_get_no_gradient():
    model = get_cl_model(tiny_vit(), RwfConfig(num_prompts=4, key_init="orthogonal"))
    model.grow_head(3)
    model(**pixels()).logits.logsumexp(-1).sum().backward()
    routers = list(model.method.routers.values())
    assert all(r.queries.grad is not None and r.queries.grad.abs().sum() > 0 for r in routers)
    assert all(r.query_proj.weight.grad.abs().sum() > 0 for r in routers)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert not any("key_weight" in n or "value_weight" in n for n in names)


class _Exp:  # the one field begin_task reads; real Experiences run in the engine test
    def __init__(self, classes):
        self.classes = classes


@pytest.mark.parametrize("make_config, current_task_loss", [
    (RwfConfig, True), (RwfConfig, False), (FinetuneConfig, True), (FinetuneConfig, False),
])
def test_current_task_loss_leaves_old_head_rows_alone(make_config, current_task_loss):
    # The base method's loss, so RwF (on by default) and any baseline (off by default) get the same option.
    extra = {"num_prompts": 2} if make_config is RwfConfig else {}
    model = get_cl_model(tiny_vit(), make_config(current_task_loss=current_task_loss, **extra))
    model.grow_head(4)
    model.method.begin_task(model, _Exp([2, 3]), None)
    batch = {**pixels(4), "labels": torch.tensor([2, 3, 3, 2])}
    model(**batch).loss.backward()
    assert (model.head.weight.grad[:2].abs().sum() == 0) == current_task_loss
    assert model.head.weight.grad[2:].abs().sum() > 0
    if current_task_loss:  # a class present in the batch (a replayed one) stays in the softmax
        model.zero_grad()
        model(**pixels(4), labels=torch.tensor([2, 3, 0, 2])).loss.backward()
        assert model.head.weight.grad[0].abs().sum() > 0 and model.head.weight.grad[1].abs().sum() == 0
    # A one-class task trains against every seen class (else its loss would be identically 0).
    model.zero_grad()
    model.method.begin_task(model, _Exp([3]), None)
    model(**pixels(4), labels=torch.full((4,), 3)).loss.backward()
    assert model.head.weight.grad[:3].abs().sum() > 0


# ---------------------------------------------------------------------------- saving


@pytest.mark.parametrize("build, inputs", [(tiny_vit, pixels), (tiny_bert, padded_text)])
def test_save_load_bit_identical(tmp_path, build, inputs):
    model = get_cl_model(build(), RwfConfig(num_prompts=3, key_init="orthogonal", init_seed=4))
    model.grow_head(5)
    perturb_trainable(model)
    model.eval()
    expected = model(**inputs()).logits
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    from hf_clroute.core.model import WEIGHTS_NAME

    saved = set(load_file(str(tmp_path / WEIGHTS_NAME)))
    assert saved and all(k.startswith(("method.routers.", "head.")) for k in saved)  # no backbone tensor
    loaded = CLModel.from_pretrained(build(), tmp_path).eval()
    assert torch.equal(loaded(**inputs()).logits, expected)


def test_lm_save_load_bit_identical_and_push(tmp_path, hub_server, hub_repo_id):
    model = get_cl_model(tiny_lm(), RwfConfig(num_prompts=2, routed_layers=[1], causal_chunk_size=4)).eval()
    perturb_trainable(model)
    ids = lm_ids()
    expected = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    assert torch.equal(CLModel.from_pretrained(tiny_lm(), tmp_path).eval()(input_ids=ids).logits, expected)
    model.push_to_hub(hub_repo_id)
    assert torch.equal(CLModel.from_pretrained(tiny_lm(), hub_repo_id).eval()(input_ids=ids).logits, expected)


# ---------------------------------------------------------------------------- real models and sizes


@pytest.mark.parametrize("attn", ATTN)
def test_pretrained_minilm_with_padding(attn):
    backbone, tokenizer = load_backbone(offline_model_path("minilm"), attn_implementation=attn)
    model = get_cl_model(backbone.eval(), RwfConfig()).eval()
    model.grow_head(3)
    sentences = ["a small domesticated carnivorous mammal", "move fast", "the act of running a race"]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()
    with torch.no_grad():
        features = model.method.features(model, dict(batch))
        alone = model.method.features(model, dict(tokenizer(sentences[1:2], return_tensors="pt")))
    assert features.shape == (3, 384) and torch.isfinite(features).all()
    torch.testing.assert_close(features[1], alone[0], atol=1e-5, rtol=1e-4)
    logits = model(**batch).logits
    logits.logsumexp(-1).sum().backward()
    assert all(r.query_proj.weight.grad.abs().sum() > 0 for r in model.method.routers.values())


def vit_b16_config() -> ViTConfig:
    return ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, image_size=224, patch_size=16)


def test_trainable_share_on_vit_b16_is_about_two_percent():
    with torch.device("meta"):  # ViT-B/16-sized, counted without allocating or running it
        backbone = ViTModel(vit_b16_config())
    model = get_cl_model(backbone, RwfConfig())
    model.grow_head(100)
    counts = model.parameter_counts()
    assert counts["backbone_params"] > 85e6
    assert 1.5 <= counts["trainable_pct"] <= 2.5
    with torch.device("meta"):
        backbone = ViTModel(vit_b16_config())
    static = get_cl_model(backbone, RwfConfig(query_mode="static"))
    assert static.parameter_counts()["trainable_pct"] < 0.1


def test_suite_configs_build_rwf():
    """Every suite resolves rwf to its settings file's values over the suite's own (the learning rate
    3e-3, not the suite's 1e-3), the run seed in every seed field, and rwf-dot to the paper's dot form."""
    method_file = json.loads((SETTINGS / "rwf.json").read_text())
    for suite in ("split-mnist", "split-fashion", "wordnet"):
        loaded = SuiteConfig.load(suite)
        assert loaded.training.get("learning_rate") != method_file["training"]["learning_rate"]
        settings = resolve_run(loaded, "rwf", seed=3)
        config = settings.adapter_config
        assert isinstance(config, RwfConfig) and settings.registered_method == "rwf"
        assert settings.training.learning_rate == method_file["training"]["learning_rate"] == 0.003
        assert settings.sources["training.learning_rate"] == "configs/methods/rwf.json"
        assert {k: getattr(config, k) for k in method_file["config"]} == method_file["config"]
        assert config.routing == "cosine" and config.scenario == loaded.scenario
        assert config.init_seed == config.head_init_seed == settings.training.seed == 3
        dot = resolve_run(loaded, "rwf-dot", seed=3)
        assert dot.registered_method == "rwf" and dot.adapter_config.routing == "dot"
        assert dot.adapter_config.beta is None and dot.training.learning_rate == 0.003  # rwf's, inherited


def test_dot_routing_is_the_paper_form_with_beta_from_beta_scale():
    """routing='dot': A = softmax over the tokens of beta <q, W_K^T z>, beta = beta_scale / sqrt(d) unless given."""
    router, tokens = router_and_tokens(beta_scale=0.25)
    assert router.beta == pytest.approx(0.25 / 4)  # d = 16
    with torch.no_grad():
        scores = torch.einsum("md,bld->bml", router.query(), tokens @ router.key_weight)
        expected = torch.softmax(router.beta * scores, -1)
        torch.testing.assert_close(router.routing_weights(tokens)[:, 0], expected)
    assert router_and_tokens(beta=0.7)[0].beta == 0.7


def test_current_task_loss_reaches_the_char_lm():
    """The LM path goes through the method loss: with current_task_loss the softmax covers only
    the tokens the batch predicts, so an unused token's output row gets no gradient."""
    ids = torch.randint(4, 20, (2, 12), generator=torch.Generator().manual_seed(5))  # tokens 20..39 unused
    grads = {}
    for flag in (True, False):
        model = get_cl_model(tiny_lm(), FinetuneConfig(freeze_backbone=False, current_task_loss=flag))
        model.train()
        out = model(input_ids=ids, labels=ids)
        assert set(out.losses) == {"ce"}
        out.loss.backward()
        grads[flag] = model.backbone.lm_head.weight.grad[30].abs().sum().item()
    assert grads[True] == 0.0 and grads[False] > 0.0


# ---------------------------------------------------------------------------- cosine routing and its health


def layer_normed_tokens(batch: int = 16, length: int = 17, dim: int = 32, seed: int = 11) -> torch.Tensor:
    tokens = torch.randn(batch, length, dim, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.layer_norm(tokens, (dim,))


def health_of(router: HopfieldRouter, tokens: torch.Tensor) -> dict[str, float]:
    from hf_clroute.methods.rwf.hopfield import RoutingHealth

    router.health = RoutingHealth()
    with torch.no_grad():
        router(tokens)
    summary, router.health = router.health.summary(), None
    return summary


def test_cosine_routing_is_softmax_of_cosines_over_temperature():
    router = HopfieldRouter(32, RwfConfig(num_prompts=4, temperature=0.2), seed=3)
    tokens = layer_normed_tokens(batch=2)
    with torch.no_grad():
        weights = router.routing_weights(tokens)[:, 0]
        cos = torch.nn.functional.cosine_similarity(router.query()[None, :, None, :], tokens[:, None, :, :], dim=-1)
    torch.testing.assert_close(weights, torch.softmax(cos / 0.2, dim=-1))


def test_cosine_routing_stays_soft_when_queries_grow_and_dot_routing_collapses():
    """Training grows the query norms; dot routing's softmax then picks one token per prompt (the
    measured collapse), cosine routing's does not move at all."""
    tokens = layer_normed_tokens()
    cosine = HopfieldRouter(32, RwfConfig(num_prompts=8), seed=0)
    dot = HopfieldRouter(32, RwfConfig(num_prompts=8, routing="dot"), seed=0)
    before = health_of(cosine, tokens)
    with torch.no_grad():
        for router in (cosine, dot):
            router.queries.mul_(8.0)
    after, collapsed = health_of(cosine, tokens), health_of(dot, tokens)
    assert after == pytest.approx(before)
    assert after["entropy_ratio"] > 0.5 and after["top_weight"] < 0.5
    assert collapsed["entropy_ratio"] < 0.3 and collapsed["top_weight"] > 0.7


def test_routing_health_names_a_prompt_that_copies_one_position():
    from hf_clroute.methods.rwf.hopfield import RoutingHealth

    health = RoutingHealth()
    weights = torch.zeros(4, 1, 2, 5)
    weights[:, 0, 0, 3] = 1.0  # prompt 0 copies position 3 for every input
    weights[:, 0, 1] = 0.2  # prompt 1 pools uniformly (ties: argmax is position 0 for every input)
    health.add(weights, torch.full((4, 1), 5))
    summary = health.summary()
    assert summary["entropy_ratio"] == pytest.approx(0.5)  # (0 + 1) / 2
    assert summary["top_weight"] == pytest.approx(0.6)  # (1 + 0.2) / 2
    assert summary["same_top_token"] == pytest.approx(1.0)
    health.add(torch.softmax(torch.randn(50, 1, 2, 5, generator=torch.Generator().manual_seed(0)) * 3, -1),
               torch.full((50, 1), 5))
    assert health.summary()["same_top_token"] < 0.9  # input-dependent routing spreads the top position


def test_model_track_records_health_per_routed_block():
    model = get_cl_model(tiny_vit(), RwfConfig(num_prompts=4, learn_temperature=True))
    model.grow_head(3)
    with model.method.track():
        model(**pixels(5))
    health = model.method.routing_health()
    assert set(health) == {"0", "1"}
    for record in health.values():
        assert 0 < record["entropy_ratio"] <= 1 and 0 < record["top_weight"] <= 1
        assert 0 < record["same_top_token"] <= 1 and record["temperature"] == pytest.approx(0.1)
    assert all(r.health is None for r in model.method.routers.values())  # tracking ends with the block


def test_learned_temperature_trains_with_the_queries():
    model = get_cl_model(tiny_vit(), RwfConfig(num_prompts=4, learn_temperature=True))
    model.grow_head(3)
    temperatures = [r.log_temperature for r in model.method.routers.values()]
    assert all(t.requires_grad for t in temperatures)
    assert {id(t) for t in temperatures} <= {id(p) for p in model.trainable_parameters()}
    out = model(**pixels(4), labels=torch.tensor([0, 1, 2, 0]))
    out.loss.backward()
    assert all(t.grad is not None and t.grad.abs() > 0 for t in temperatures)
    fixed = get_cl_model(tiny_vit(), RwfConfig(num_prompts=4))
    assert not any(r.log_temperature.requires_grad for r in fixed.method.routers.values())


@pytest.mark.parametrize("build", [tiny_vit, tiny_lm])
def test_pretrained_key_and_value_come_from_the_blocks_own_attention(build):
    backbone = build()
    model = get_cl_model(backbone, RwfConfig(num_prompts=4, key_init="pretrained", value_init="pretrained"))
    d = model.spec.hidden_size(backbone)
    for idx, router in model.method.routers.items():
        block = get_blocks(backbone)[int(idx)]
        if model.spec.causal:  # GPT-2: one fused Conv1D, y = x W + b, columns [q | k | v]
            fused = block.attn.base_layer.c_attn
            key, value, bias = fused.weight[:, d:2 * d], fused.weight[:, 2 * d:], fused.bias[2 * d:]
        else:  # ViT: separate nn.Linear, y = x W^T + b
            attention = block.attention.base_layer
            key, value, bias = attention.k_proj.weight.T, attention.v_proj.weight.T, attention.v_proj.bias
        torch.testing.assert_close(router.key_weight, key)
        torch.testing.assert_close(router.value_weight, value)
        torch.testing.assert_close(router.value_bias, bias)
        assert not router.key_weight.requires_grad
        tokens = layer_normed_tokens(batch=2, length=6, dim=d)
        with torch.no_grad():
            weights = router.routing_weights(tokens)[:, 0]
            prompts, _ = router(tokens)
            expected = torch.einsum("bml,bld->bmd", weights, tokens @ value + bias)
        torch.testing.assert_close(prompts, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("refresh", [2, 1000])
def test_routers_train_on_the_first_task_only_then_a_statistics_head_accumulates(stream, refresh):
    """train_routers_for_tasks=1 with an LDA head: the routers learn through that head's loss on
    task 0 (the head re-solved every ``head_refresh_steps``; with no solve before the task ends its
    classes score -inf and the routers get no gradient), stay fixed afterwards (nothing left to
    train on task 1: the head only accumulates)."""
    config = RwfConfig(num_prompts=4, head="lda", train_routers_for_tasks=1, head_refresh_steps=refresh)
    model = get_cl_model(tiny_vit(), config)
    initial = [r.query().detach().clone() for r in model.method.routers.values()]
    snapshots = []

    class AfterTask(Callback):
        def on_task_end(self, trainer, task_id):
            snapshots.append([r.query().detach().clone() for r in trainer.model.method.routers.values()])

    training = TrainingConfig(batch_size=8, learning_rate=1e-2, progress=False, evals_per_task=0)
    trainer = ContinualTrainer(model, stream, training, ImageCollator(16, num_channels=3),
                               make_accelerator(training, cpu=True), callbacks=[AfterTask()])
    result = trainer.fit()
    assert result.finished and len(snapshots) == 2
    moved = [not torch.equal(a, b) for a, b in zip(snapshots[0], initial)]
    assert all(moved) if refresh == 2 else not any(moved)
    assert all(torch.equal(a, b) for a, b in zip(snapshots[0], snapshots[1]))  # frozen on task 1
    assert model.trainable_parameters() == [] and model.head.counts.sum() == 4 * 16


def test_frozen_routers_stay_frozen_after_reload(tmp_path):
    model = get_cl_model(tiny_vit(), RwfConfig(num_prompts=4, train_routers_for_tasks=1))
    model.grow_head(2)
    model.method.on_task_end(model, None, None)
    assert not any(p.requires_grad for p in model.method.routers.parameters())
    model.save_pretrained(tmp_path / "a")
    reloaded = CLModel.from_pretrained(tiny_vit(), tmp_path / "a", is_trainable=True)  # to continue training
    assert reloaded.method.tasks_done == 1
    assert not any(p.requires_grad for p in reloaded.method.routers.parameters())
    assert all(p.requires_grad for p in reloaded.head.parameters())


# ---- the tuned knobs: W_V and the temperature -----------------------------------------------------------


SEARCHED = ["rwf", "rwf-dot", "rwf-static", "rwf-pretrained-key", "rwf-full-softmax", "rwf-head-only"]


@pytest.mark.parametrize("method", SEARCHED)
def test_search_grids_are_valid_configurations_with_rwf_s_budget(method, checked_search_grid):
    """RwF and its control get the same budget, each point a valid run; rwf's points cover the
    three frozen value projections and a second temperature, rwf-dot's (the paper's form) the same
    projections and a second beta."""
    grid = checked_search_grid(method)
    if method in ("rwf", "rwf-dot"):
        assert {p["config.value_init"] for p in grid} == set(RwfConfig.MATRIX_INITS)
        knob = "config.temperature" if method == "rwf" else "config.beta_scale"
        assert len({p[knob] for p in grid}) == 2
