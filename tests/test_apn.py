"""APN: routed low-rank patch FFN (replace and adapter modes), its training hooks and saving."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import BertModel, GPT2LMHeadModel, ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import char_lm_config, get_blocks, tiny_bert_config, tiny_vit_config
from hf_clroute.backbones.char_tokenizer import CharTokenizer
from hf_clroute.baselines import FfnFinetuneConfig
from hf_clroute.core.method import StepContext
from hf_clroute.core.model import CLModel
from hf_clroute.data import CausalLMCollator, load_source, text_domains
from hf_clroute.engine import make_accelerator
from hf_clroute.methods.apn import ApnConfig, PatchFFN, patch_overlap

D, K, TOP_K, RANK = 16, 8, 2, 4
VOCAB = 40


def bank(top_k: int = TOP_K, **kwargs) -> PatchFFN:
    torch.manual_seed(0)
    return PatchFFN(D, num_patches=K, top_k=top_k, rank=RANK, **kwargs)


def dense_reference(p: PatchFFN, h: torch.Tensor) -> torch.Tensor:
    """Every patch evaluated densely, then combined with the top-k softmax weights."""
    x = F.layer_norm(h, (D,))
    scores = F.normalize(x, dim=-1) @ F.normalize(p.prototypes, dim=-1).T / p.tau
    top, idx = scores.topk(TOP_K, dim=-1)
    u = p.encoder(x)  # (N, r)
    z = u[:, None] * torch.sigmoid(p.gate_scale[None] * u[:, None] + p.gate_bias[None])  # (N, K, r)
    deltas = torch.einsum("nkr,krd->nkd", z, p.decoders.view(K, RANK, D))  # (N, K, d)
    chosen = deltas.gather(1, idx[..., None].expand(-1, -1, D))
    return p.gamma * (top.softmax(-1)[..., None] * chosen).sum(1)


def test_forward_matches_dense_reference_and_weights_sum_to_one():
    p = bank(gamma=0.5)
    h = torch.randn(10, D)
    torch.testing.assert_close(p(h), dense_reference(p, h), rtol=1e-5, atol=1e-6)
    idx, weights, scores = p.route(F.layer_norm(h, (D,)))
    torch.testing.assert_close(weights.sum(-1), torch.ones(10))
    assert (weights > 0).all() and idx.shape == (10, TOP_K)
    # the kept patches are the best-scoring ones
    assert torch.equal(idx.sort(-1).values, scores.topk(TOP_K, -1).indices.sort(-1).values)


def test_only_the_top_k_patches_receive_gradient_for_a_token():
    p = bank()
    h = torch.randn(1, D)
    chosen = set(p.route(F.layer_norm(h, (D,)))[0][0].tolist())
    p(h).pow(2).sum().backward()
    per_patch = {
        "decoders": p.decoders.grad.view(K, -1), "gate_scale": p.gate_scale.grad,
        "gate_bias": p.gate_bias.grad, "prototypes": p.prototypes.grad,
    }
    for name, grad in per_patch.items():
        touched = {i for i in range(K) if grad[i].abs().sum() > 0}
        assert touched == chosen, name
    assert len(chosen) == TOP_K


def test_load_balance_loss_is_zero_at_uniform_usage_and_positive_when_skewed():
    p = bank(top_k=1)
    x = torch.randn(K, D)
    with torch.no_grad():
        p.prototypes.copy_(x)  # token i's best patch is patch i: every patch used once
    idx, _, scores = p.route(x)
    assert torch.bincount(idx.flatten(), minlength=K).eq(1).all()
    assert abs(p.load_balance_loss(idx, scores).item()) < 1e-6
    same = x[:1].expand(K, D)  # every token routed to the same patches
    idx, _, scores = p.route(same)
    assert p.load_balance_loss(idx, scores).item() > 0.5


def tiny_lm(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(char_lm_config(VOCAB, n_layer=2, n_embd=32, n_head=2, n_positions=64))


def lm_config(**kwargs) -> ApnConfig:
    return ApnConfig(mode="replace", freeze_backbone=False, num_patches=8, top_k=2, rank=4, **kwargs)


def test_replace_mode_lm_still_generates_with_and_without_cache():
    model = get_cl_model(tiny_lm(), lm_config(target_blocks=[-1]))
    lm = model.backbone
    assert isinstance(lm, GPT2LMHeadModel)
    blocks = get_blocks(lm)
    assert isinstance(blocks[1].mlp, PatchFFN) and not isinstance(blocks[0].mlp, PatchFFN)
    prompt = torch.tensor([[2, 5, 6, 7]])
    lm.eval()
    cached = lm.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    plain = lm.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert cached.shape == (1, 10) and torch.equal(cached, plain)


def test_replace_mode_save_load_is_bit_identical(tmp_path):
    model = get_cl_model(tiny_lm(), lm_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.method.patch_usage = torch.rand(2, 2, 8, dtype=torch.float64)
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(tiny_lm(seed=1), tmp_path)
    ids = torch.tensor([[2, 5, 6, 7, 8, 9]])
    model.eval(), loaded.eval()
    assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert torch.equal(loaded.method.patch_usage, model.method.patch_usage)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["vit", "bert"])
def test_adapter_mode_keeps_shapes_starts_at_the_pretrained_function_and_round_trips(family, attn, tmp_path):
    def backbone():
        torch.manual_seed(0)
        if family == "vit":
            return ViTModel(tiny_vit_config(attn_implementation=attn))
        return BertModel(tiny_bert_config(attn_implementation=attn))

    if family == "vit":
        inputs = {"pixel_values": torch.randn(3, 3, 16, 16)}
    else:
        ids = torch.tensor([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0], [2, 4, 3, 0, 0]])
        inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    plain = backbone().eval()
    reference = plain(**inputs).last_hidden_state
    model = get_cl_model(backbone(), ApnConfig(num_patches=8, top_k=2, rank=4)).eval()
    model.grow_head(3)
    torch.testing.assert_close(model.backbone(**inputs).last_hidden_state, reference)  # zero-init patches
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".patches." in n or n.startswith("head.") for n in trainable)
    with torch.no_grad():
        for bank_ in model.method.banks:
            bank_.decoders.normal_()
    out = model.backbone(**inputs).last_hidden_state
    assert out.shape == reference.shape and not torch.allclose(out, reference)
    assert model(**inputs).logits.shape == (3, 3)
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(backbone(), tmp_path).eval()
    assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)


def test_bert_replace_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        get_cl_model(BertModel(tiny_bert_config()), ApnConfig(mode="replace", num_patches=8, top_k=2, rank=4))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"top_k": 9, "num_patches": 8}, "top_k"), ({"mode": "dense"}, "mode"), ({"adapt_params": "head"}, "adapt_params"),
     ({"tau": 0}, "tau"), ({"rank": 2.5}, "rank"), ({"target_blocks": 1}, "target_blocks"),
     ({"code_encoder": "dense"}, "code_encoder"), ({"load_balance_horizon": 0}, "load_balance_horizon"),
     ({"load_balance_horizon": 2.5}, "load_balance_horizon"),
     ({"freeze_routing_after_first_task": "yes"}, "freeze_routing_after_first_task")],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ApnConfig(**kwargs)


def test_patch_overlap_identical_and_disjoint_usage():
    a = torch.tensor([[10.0, 10, 0, 0]])
    b = torch.tensor([[0.0, 0, 5, 5]])
    usage = torch.stack([a, a, b]).double()  # (tasks, banks, K)
    overlap = patch_overlap(usage)
    assert overlap["jaccard"][0][1] == 1.0 and overlap["weighted_jaccard"][0][1] == 1.0
    assert overlap["jaccard"][0][2] == 0.0 and overlap["weighted_jaccard"][0][2] == 0.0


@pytest.fixture(scope="module")
def two_domains():
    corpora = [load_source("shakespeare"), load_source("kjv")]
    stream = text_domains(corpora, ["shakespeare", "kjv"], train_chars=16_000, test_chars=4_000, seed=0)
    tokenizer = CharTokenizer.from_corpus([e.train[i]["text"] for e in stream for i in range(len(e.train))])
    return stream, tokenizer


@pytest.mark.parametrize("config", [lm_config(adapt_params="ffn"), FfnFinetuneConfig()], ids=["apn", "dense"])
def test_ffn_only_adaptation_trains_only_the_ffns_on_later_domains(two_domains, config, tmp_path):
    stream, tokenizer = two_domains
    torch.manual_seed(0)
    backbone = GPT2LMHeadModel(char_lm_config(len(tokenizer), n_layer=2, n_embd=32, n_head=2, n_positions=64))
    model = get_cl_model(backbone, config)
    ffn_ids = {id(p) for block in get_blocks(backbone) for p in block.mlp.parameters()}
    # Snapshot the non-FFN weights when domain B starts (after domain A trained them).
    snapshot = {}
    method = model.method
    start = method.on_task_start

    def on_task_start(model_, experience, ctx):
        start(model_, experience, ctx)
        if ctx.task_id == 1:
            trainable = {id(p) for p in model_.trainable_parameters()}
            assert trainable == ffn_ids
            snapshot.update({n: p.detach().clone() for n, p in model_.named_parameters() if id(p) not in ffn_ids})

    method.on_task_start = on_task_start
    training = TrainingConfig(batch_size=4, learning_rate=3e-3, progress=False)
    trainer = ContinualTrainer(
        model, stream, training, CausalLMCollator(tokenizer, 64), make_accelerator(training, cpu=True)
    )
    result = trainer.fit()
    R = result.accuracy_matrix
    assert len(R) == 2 and all(len(r) == 2 and all(x > 1.0 for x in r) for r in R)  # perplexities
    assert R[0][0] < result.untrained_accuracy[0]  # domain A was learnt
    for name, before in snapshot.items():
        assert torch.equal(dict(model.named_parameters())[name], before), name
    # every weight is trainable (and saved) again between tasks
    assert all(p.requires_grad for p in model.parameters())
    if config.method == "apn":
        usage = model.method.patch_usage
        assert usage.shape == (2, 2, 8) and (usage.sum(-1) > 0).all()
        model.save_pretrained(tmp_path)
        loaded = CLModel.from_pretrained(GPT2LMHeadModel(backbone.config), tmp_path).eval()
        ids = torch.tensor([[5, 6, 7, 8]])
        model.eval()
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
        assert torch.equal(loaded.method.patch_usage, usage)


def test_load_balance_term_is_part_of_the_forward_loss():
    model = get_cl_model(tiny_lm(), lm_config(load_balance_weight=0.5))
    model.train()
    ids = torch.randint(4, VOCAB, (2, 8))
    out = model(input_ids=ids, labels=ids)  # the loss, load balance included, comes out of the one call
    assert set(out.losses) == {"ce", "load_balance"} and out.losses["load_balance"].requires_grad
    torch.testing.assert_close(out.loss, out.losses["ce"] + out.losses["load_balance"])
    assert model.method.extra_losses(model, {}, None) == {}  # consumed once
    model.method.after_step(model, {}, out, StepContext(0))
    assert model.method._pending.sum().item() == 2 * 2 * 8 * 2  # banks x tokens x top_k per bank


def test_charlm_runner_end_to_end_on_a_tiny_suite(tmp_path):
    import json

    from hf_clroute.bench.runners.lm import expand_variants, run

    assert expand_variants(["apn", "dense-all"]) == ["apn-all", "apn-ffn", "dense-all"]
    with pytest.raises(ValueError, match="variant"):
        expand_variants(["lora-all"])
    suite = {
        "name": "charlm-domains", "runner": "charlm", "domains": ["shakespeare", "kjv", "python_code"],
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2}, "block_size": 32, "train_chars": 1500, "test_chars": 300,
        "training": {"batch_size": 8, "learning_rate": 0.003}, "methods": ["dense-ffn", "apn-ffn"],
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    results = run(str(path), methods=None, seeds=[0], quick=False, out=tmp_path / "out")
    assert json.loads((tmp_path / "out" / "results.json").read_text())["suite"] == "charlm-domains"
    assert "apn-ffn" in (tmp_path / "out" / "results.md").read_text()
    dense, apn = results["methods"]["dense-ffn"], results["methods"]["apn-ffn"]
    for m in (dense, apn):
        P = m["ppl_matrix"]
        assert len(P) == 3 and all(len(row) == 3 and all(x > 1 for x in row) for row in P)
        assert m["retention"]["mean"] == pytest.approx(P[1][0] / P[0][0])
        assert [a["mean"] for a in m["adaptation"]] == pytest.approx([P[1][1], P[2][2]])
    # dense GPT-2 MLP: 2 * 2 * d * 4d per token; APN bank: routing + code + top-k decoders
    assert dense["ffn_flops_per_token"] == 16 * 16 * 16
    assert apn["ffn_flops_per_token"] == 2 * (64 * 16 + 16 * 32 + 4 * 32 * 16) + 4 * 4 * 32
    overlap = apn["patch_overlap"]["weighted_jaccard"]
    assert len(overlap) == 3 and overlap[0][0] == pytest.approx(1.0)
    assert results["throughput_ratio"]["ffn"] > 0
    # A second seed run as its own invocation joins the table through `hf-clroute merge`.
    from hf_clroute.cli import main

    run(str(path), methods=["dense-ffn"], seeds=[1], quick=False, out=tmp_path / "seed1")
    assert main(["merge", str(tmp_path / "out"), str(tmp_path / "seed1"), "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["seeds"] == [0, 1] and merged["commands"][-1].startswith("hf-clroute merge")
    rows = merged["methods"]["dense-ffn"]["per_seed"]
    assert [r["seed"] for r in rows] == [0, 1]
    assert merged["methods"]["dense-ffn"]["retention"]["mean"] == pytest.approx(sum(r["retention"] for r in rows) / 2)
    assert [r["seed"] for r in merged["methods"]["apn-ffn"]["per_seed"]] == [0]
    assert "throughput_ratio" in merged and "patch_overlap" in merged["methods"]["apn-ffn"]


def test_charlm_suite_with_local_text_domains(tmp_path):
    """Any text is a domain: a local .txt file and a {"train", "test", "name"} mapping of .txt files,
    shown under readable names; a missing file is refused before training, naming it."""
    import json

    from hf_clroute.bench.runners.lm import run

    poem = tmp_path / "poems.txt"
    poem.write_text("".join(f"the rose is red and the sky is blue, line {i}\n" for i in range(200)))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.txt").write_text("".join(f"INFO step={i} loss={i / 7:.3f} ok\n" for i in range(200)))
    (tmp_path / "logs" / "b.txt").write_text("".join(f"WARN step={i} grad={i / 3:.2f}\n" for i in range(40)))
    suite = {
        "name": "my-texts", "runner": "charlm",
        "domains": [str(poem), {"train": str(tmp_path / "logs" / "a.txt"), "test": str(tmp_path / "logs" / "b.txt"),
                                "name": "server-logs"}],
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2}, "block_size": 32, "train_chars": 2000, "test_chars": 400,
        "training": {"batch_size": 8, "learning_rate": 0.003}, "methods": ["dense-all"],
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    results = run(str(path), methods=None, seeds=[0], quick=False, out=tmp_path / "out")
    assert results["config"]["domain_names"] == ["poems", "server-logs"]
    P = results["methods"]["dense-all"]["ppl_matrix"]
    assert len(P) == 2 and all(x > 1 for row in P for x in row)
    assert "| poems |" in (tmp_path / "out" / "results.md").read_text()

    suite["domains"] = [str(poem), str(tmp_path / "missing.txt")]
    path.write_text(json.dumps(suite))
    with pytest.raises(ValueError, match="missing.txt"):
        run(str(path), methods=None, seeds=[0], quick=False, out=tmp_path / "out2")
    assert not (tmp_path / "out2" / "results.json").exists()


def test_renamed_copy_of_the_charlm_suite_keeps_its_apn_settings(tmp_path):
    import json

    from hf_clroute.bench.runners.lm import CharLMSuite, apn_settings

    path = tmp_path / "my-charlm.json"
    path.write_text(json.dumps({"name": "my-charlm", "base": "charlm-domains"}))
    original, copy = CharLMSuite.load("charlm-domains"), CharLMSuite.load(str(path))
    assert copy.bases == ["charlm-domains"]
    from hf_clroute.bench.harness.settings import merged_method_settings

    assert apn_settings(copy) == apn_settings(original) != merged_method_settings("apn", [])["config"]
    assert apn_settings(copy)["num_patches"] == 64  # the charlm-domains block, not the method file's 256


# ------------------------------------------------------------------ issue 14: locality options
def per_patch_reference(p: PatchFFN, h: torch.Tensor) -> torch.Tensor:
    """Every patch's own code and residual evaluated densely, then the top-k combination."""
    x = F.layer_norm(h, (D,))
    scores = F.normalize(x, dim=-1) @ F.normalize(p.prototypes, dim=-1).T / p.tau
    top, idx = scores.topk(p.top_k, dim=-1)
    W, b = p.encoder.weight.view(K, RANK, D), p.encoder.bias.view(K, RANK)
    u = torch.einsum("nd,krd->nkr", x, W) + b  # (N, K, r): patch k's code of token n
    z = u * torch.sigmoid(p.gate_scale[None] * u + p.gate_bias[None])
    deltas = torch.einsum("nkr,krd->nkd", z, p.decoders.view(K, RANK, D))
    chosen = deltas.gather(1, idx[..., None].expand(-1, -1, D))
    return p.gamma * (top.softmax(-1)[..., None] * chosen).sum(1)


def test_per_patch_encoders_give_each_patch_its_own_code():
    p = bank(code_encoder="per_patch")
    assert p.encoder.weight.shape == (K * RANK, D) and p.flops_per_token() > bank().flops_per_token()
    h = torch.randn(12, D)
    torch.testing.assert_close(p(h), per_patch_reference(p, h), rtol=1e-5, atol=1e-6)
    idx, _, scores = p.route(F.layer_norm(h, (D,)))
    before = p(h).detach()
    # Changing patch i's encoder changes exactly the tokens routed to i (their Delta_i), not the
    # routing scores (the encoders are not part of routing) and no other token.
    i = int(idx[0, 0])
    with torch.no_grad():
        p.encoder.weight.view(K, RANK, D)[i] += torch.randn(RANK, D)  # (a constant would vanish: LN(h) sums to 0)
    after = p(h).detach()
    torch.testing.assert_close(p.route(F.layer_norm(h, (D,)))[2], scores)
    uses_i = (idx == i).any(-1)
    changed = (after - before).abs().amax(-1) > 1e-6
    assert uses_i.any() and torch.equal(changed, uses_i)
    # a token's backward reaches only its top-k patches' encoders
    p.zero_grad()
    token = h[:1]
    chosen = set(p.route(F.layer_norm(token, (D,)))[0][0].tolist())
    p(token).pow(2).sum().backward()
    grad = p.encoder.weight.grad.view(K, -1).abs().sum(-1) + p.encoder.bias.grad.view(K, -1).abs().sum(-1)
    assert {j for j in range(K) if grad[j] > 0} == chosen


def test_per_patch_encoders_handle_one_patch_taking_every_token():
    p = bank(code_encoder="per_patch")
    h = torch.randn(1, D).expand(150, D).contiguous()  # every token to the same top-k patches: 3 blocks each
    torch.testing.assert_close(p(h), per_patch_reference(p, h), rtol=1e-5, atol=1e-6)


def test_long_horizon_balance_uses_a_hand_computed_ema_of_usage():
    horizon = 4
    p = bank(balance_horizon=horizon)
    decay = 1 - 1 / horizon
    ema = torch.zeros(K)
    for step in range(1, 4):
        x = torch.randn(6, D)
        idx, _, scores = p.route(x)
        fraction = torch.bincount(idx.flatten(), minlength=K).float() / idx.numel()
        ema = decay * ema + (1 - decay) * fraction
        corrected = ema / (1 - decay**step)
        expected = K * (corrected * scores.softmax(-1).mean(0)).sum() - 1
        torch.testing.assert_close(p.load_balance_loss(idx, scores), expected)
        torch.testing.assert_close(p.usage_ema, ema)
        assert int(p.usage_ema_steps) == step
    assert not hasattr(bank(), "usage_ema")  # horizon 1 (the default) keeps no state: the batch's usage


def test_long_horizon_balance_does_not_spread_a_new_domain_over_the_old_domains_patches():
    """Patches 0-3 serve domain A, 4-7 domain B (top-1). After a run of A batches, a B batch's balance
    gradient, per batch, moves B's routing mass onto A's patches (it spreads each single-domain batch
    over all patches); over a long horizon, A's accumulated usage pushes B away from A's patches."""
    eye = torch.eye(D)[:K]
    domain_a, domain_b = eye[:4].repeat(4, 1), eye[4:].repeat(4, 1)

    def mass_on_a_after_a_balance_step(horizon: int) -> tuple[float, float]:
        p = bank(top_k=1, balance_horizon=horizon, tau=1.0)  # soft scores: the softmax is not saturated
        with torch.no_grad():
            p.prototypes.copy_(eye)
        for _ in range(50):
            p.load_balance_loss(*p.route(domain_a)[::2])
        idx, _, scores = p.route(domain_b)
        assert set(idx.flatten().tolist()) == {4, 5, 6, 7}
        scores = scores.detach().requires_grad_(True)
        p.load_balance_loss(idx, scores).backward()
        stepped = scores - 0.5 * scores.grad
        mass = [float(s.detach().softmax(-1)[:, :4].sum(-1).mean()) for s in (scores, stepped)]
        return mass[0], mass[1]

    before, after = mass_on_a_after_a_balance_step(1)
    assert after > before  # per batch: B is pushed into A's patches
    before, after = mass_on_a_after_a_balance_step(1000)
    assert after < before  # long horizon: B is pushed off A's patches


def frozen_routing_params(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if n.endswith("prototypes") or ".mlp.encoder." in n}


@pytest.mark.parametrize("encoder", ["shared", "per_patch"])
def test_frozen_routing_gets_no_gradient_after_the_first_task(encoder):
    model = get_cl_model(tiny_lm(), lm_config(freeze_routing_after_first_task=True, code_encoder=encoder))
    routing = frozen_routing_params(model)
    assert len(routing) == 2 * (1 + 2)  # per bank: prototypes, encoder weight and bias
    method, ids = model.method, torch.randint(4, VOCAB, (2, 8))
    model.train()
    for task in (0, 1):
        method.on_task_start(model, None, StepContext(task))
        trainable = model.trainable_parameters()
        optimizer = torch.optim.AdamW(trainable, lr=0.1, weight_decay=0.1)
        snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        moved = {n for n, p in model.named_parameters() if not torch.equal(p, snapshot[n])}
        if task == 0:
            assert set(routing) <= moved  # the first task trains the routing
        else:
            assert all(not p.requires_grad and p.grad is None for p in routing.values())
            assert not set(routing) & moved and {id(p) for p in routing.values()}.isdisjoint(map(id, trainable))
            assert any(n.endswith("decoders") for n in moved) and any("attn" in n for n in moved)
        optimizer.zero_grad(set_to_none=True)
        method.on_task_end(model, None, StepContext(task))
        assert all(p.requires_grad for p in model.parameters())  # trainable (and saved) between tasks


def test_frozen_routing_and_long_horizon_state_survive_save_load_and_resume(tmp_path):
    from hf_clroute.bench.runners.lm import windows

    corpora = [load_source("shakespeare"), load_source("kjv")]
    stream = text_domains(corpora, ["shakespeare", "kjv"], train_chars=3_000, test_chars=600, seed=0)
    stream = [dataclasses.replace(e, train=windows(e.train, 32), test=windows(e.test, 32)) for e in stream]
    tokenizer = CharTokenizer.from_corpus([t for e in stream for split in (e.train, e.test) for t in split["text"]])
    config = lm_config(freeze_routing_after_first_task=True, code_encoder="per_patch", load_balance_horizon=50)

    def fresh():
        torch.manual_seed(0)
        backbone = GPT2LMHeadModel(char_lm_config(len(tokenizer), n_layer=2, n_embd=32, n_head=2, n_positions=32))
        return get_cl_model(backbone, config)

    snapshots = []

    def trainer(model, **kwargs):
        start = model.method.on_task_start

        def on_task_start(model_, experience, ctx):
            start(model_, experience, ctx)
            if ctx.task_id == 1:
                snapshots.append({n: p.detach().clone() for n, p in frozen_routing_params(model_).items()})
                assert all(not p.requires_grad for p in frozen_routing_params(model_).values())

        model.method.on_task_start = on_task_start
        training = TrainingConfig(batch_size=8, learning_rate=3e-3, progress=False,
                                  checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=3, **kwargs)
        return ContinualTrainer(
            model, stream, training, CausalLMCollator(tokenizer, 32), make_accelerator(training, cpu=True)
        )

    steps_a = -(-len(stream[0].train) // 8)
    first = fresh()
    partial = trainer(first, stop_after_steps=steps_a + 4).fit()  # killed mid-way through task 1
    assert not partial.finished and len(snapshots) == 1
    resumed_model = fresh()
    trainer(resumed_model).fit(resume_from=tmp_path / "ckpt")
    assert len(snapshots) == 2  # the resumed run re-froze the routing at task 1 ...
    for name, value in snapshots[1].items():  # ... which the checkpoint held as task 0 left it
        assert torch.equal(value, snapshots[0][name]), name
        assert torch.equal(dict(resumed_model.named_parameters())[name], value), name
    banks = resumed_model.method.banks
    assert all(int(b.usage_ema_steps) == 2 * steps_a for b in banks)  # the usage average carried across the stop
    resumed_model.save_pretrained(tmp_path / "adapter")
    loaded = CLModel.from_pretrained(GPT2LMHeadModel(resumed_model.backbone.config), tmp_path / "adapter").eval()
    assert loaded.config.freeze_routing_after_first_task and loaded.config.code_encoder == "per_patch"
    for a, b in zip(banks, loaded.method.banks):
        assert torch.equal(a.usage_ema, b.usage_ema) and torch.equal(a.usage_ema_steps, b.usage_ema_steps)
    ids = torch.tensor([[5, 6, 7, 8]])
    resumed_model.eval()
    assert torch.equal(loaded(input_ids=ids).logits, resumed_model(input_ids=ids).logits)


def test_charlm_apn_settings_variants_resolve_to_their_configs():
    from hf_clroute.bench.runners.lm import CharLMSuite, expand_variants, parse_variant, variant_config

    assert expand_variants(["apn-frozen-routing"]) == ["apn-frozen-routing-all", "apn-frozen-routing-ffn"]
    assert parse_variant("apn-per-patch-all") == ("apn-per-patch", "all")
    for bad in ("apn-nonexistent-all", "lora-all", "apn-per-patch-head"):
        with pytest.raises(ValueError, match="variant"):
            parse_variant(bad)
    suite = CharLMSuite.load("charlm-plateau")
    configs = {v: variant_config(suite, v) for v in expand_variants(suite.methods)}
    apn = configs["apn-all"]
    assert apn.num_patches == 64 and apn.mode == "replace"  # the charlm-domains block, through the suite's base
    assert configs["apn-frozen-routing-all"].freeze_routing_after_first_task
    assert configs["apn-per-patch-all"].code_encoder == "per_patch"
    assert configs["apn-lb-horizon-all"].load_balance_horizon > 1
    assert configs["apn-no-balance-all"].load_balance_weight == 0
    for name, cfg in configs.items():  # each variant differs from apn-all only in its own option
        if name.startswith("apn-") and name != "apn-all":
            differ = {k for k, v in cfg.to_dict().items() if apn.to_dict().get(k) != v}
            assert len(differ) == 1, (name, differ)
