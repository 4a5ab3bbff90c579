"""APN: routed low-rank patch FFN (replace and adapter modes), its training hooks and saving."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import BertModel, GPT2LMHeadModel, ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones import char_lm_config, get_blocks, tiny_bert_config, tiny_vit_config
from hf_clroute.char_tokenizer import CharTokenizer
from hf_clroute.data import CausalLMCollator, load_source, text_domains
from hf_clroute.engine import make_accelerator
from hf_clroute.baselines import FfnFinetuneConfig
from hf_clroute.methods.apn import ApnConfig, PatchFFN, patch_overlap
from hf_clroute.methods.base import StepContext
from hf_clroute.model import CLModel

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
     ({"tau": 0}, "tau"), ({"rank": 2.5}, "rank"), ({"target_blocks": 1}, "target_blocks")],
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
    trainer = ContinualTrainer(model, stream, training, CausalLMCollator(tokenizer, 64), make_accelerator(training, cpu=True))
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

    from hf_clroute.bench.lm import expand_variants, run

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

    from hf_clroute.bench.lm import run

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

    from hf_clroute.bench.lm import CharLMSuite, apn_settings

    path = tmp_path / "my-charlm.json"
    path.write_text(json.dumps({"name": "my-charlm", "base": "charlm-domains"}))
    original, copy = CharLMSuite.load("charlm-domains"), CharLMSuite.load(str(path))
    assert copy.bases == ["charlm-domains"]
    from hf_clroute.bench.settings import merged_method_settings

    assert apn_settings(copy) == apn_settings(original) != merged_method_settings("apn", [])["config"]
    assert apn_settings(copy)["num_patches"] == 64  # the charlm-domains block, not the method file's 256
