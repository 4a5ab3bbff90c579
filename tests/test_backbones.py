"""The backbone map, CharTokenizer and IncrementalClassifier on tiny models.

Tiny configs are built in code; only the MiniLM test reads a real checkpoint
(installed as a pip package, loaded with the Hub offline).
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    BertForSequenceClassification,
    BertModel,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTForImageClassification,
    ViTModel,
)
from transformers.pytorch_utils import Conv1D  # noqa: E402

from hf_clroute.backbones.catalog import (  # noqa: E402
    BACKBONES,
    BLOCK_PARTS,
    UnsupportedBackboneError,
    char_lm_config,
    get_backbone_spec,
    get_base_model,
    get_block_part,
    get_blocks,
    load_backbone,
    offline_model_path,
    pooled_features,
    tiny_bert_config,
    tiny_vit_config,
)
from hf_clroute.backbones.char_tokenizer import CharTokenizer  # noqa: E402
from hf_clroute.heads import IncrementalClassifier, task_mask_logits  # noqa: E402

CORPUS = ["To be, or not to be, that is the question:\n", "Whether 'tis nobler in the mind"]



def pooled(model: nn.Module, **inputs) -> torch.Tensor:
    """(B, d) pooled features of a backbone, as ``CLModel.extract_features`` computes them."""
    base = get_base_model(model)
    spec = get_backbone_spec(base)
    if spec.causal:
        inputs.setdefault("use_cache", False)
    return pooled_features(spec, base(**inputs), inputs.get("attention_mask"))

def _tiny_char_lm(tokenizer: CharTokenizer, **overrides) -> GPT2LMHeadModel:
    config = char_lm_config(
        tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=64, **overrides
    )
    return GPT2LMHeadModel(config)


def _build(family: str, attn: str = "sdpa") -> nn.Module:
    torch.manual_seed(0)
    if family == "vit":
        return ViTModel(tiny_vit_config(attn_implementation=attn))
    if family == "bert":
        return BertModel(tiny_bert_config(attn_implementation=attn))
    return _tiny_char_lm(CharTokenizer.from_corpus(CORPUS), attn_implementation=attn)


def _inputs(family: str) -> dict[str, torch.Tensor]:
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16)}
    return {"input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}


# (attention class, FFN linear class, pre-attention norm class) per family in 5.24
EXPECTED = {
    "vit": ("ViTAttention", nn.Linear, nn.LayerNorm),
    "bert": ("BertAttention", nn.Linear, type(None)),
    "gpt2": ("GPT2Attention", Conv1D, nn.LayerNorm),
}


@pytest.mark.parametrize("family", sorted(BACKBONES))
def test_map_finds_parts(family: str) -> None:
    model = _build(family)
    spec = get_backbone_spec(model)
    base = get_base_model(model)
    assert spec.model_type == family
    assert type(base).__name__ == spec.base_model_class
    assert spec.base_model_attr == model.base_model_prefix
    blocks = get_blocks(model)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == 2
    attn_cls, ffn_cls, norm_cls = EXPECTED[family]
    block = blocks[0]
    assert type(get_block_part(block, spec, "attention")).__name__ == attn_cls
    assert isinstance(get_block_part(block, spec, "ffn_in"), ffn_cls)
    assert isinstance(get_block_part(block, spec, "ffn_out"), ffn_cls)
    assert isinstance(get_block_part(block, spec, "pre_attention_norm"), norm_cls)
    for path in spec.ffn + spec.attention_qkv:
        block.get_submodule(path)
    names = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    assert set(spec.lora_target_modules) <= names
    assert spec.hidden_size(model) == 32
    features = pooled(model, **_inputs(family))
    assert features.shape == (2, 32)


def test_block_part_rejects_unknown_name() -> None:
    spec = BACKBONES["vit"]
    with pytest.raises(KeyError, match="known"):
        get_block_part(get_blocks(_build("vit"))[0], spec, "mlp")
    assert "attention" in BLOCK_PARTS


@pytest.mark.parametrize(
    "task_cls, attr, config_fn",
    [(ViTForImageClassification, "vit", tiny_vit_config),
     (BertForSequenceClassification, "bert", tiny_bert_config)],
)
def test_task_models_resolve_to_base(task_cls, attr, config_fn) -> None:
    model = task_cls(config_fn(num_labels=3))
    assert get_base_model(model) is getattr(model, attr)
    assert get_blocks(model) is get_blocks(getattr(model, attr))


def test_unsupported_architecture_lists_supported() -> None:
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, vocab_size=50)
    with pytest.raises(UnsupportedBackboneError, match="'llama'.*bert, gpt2, vit"):
        get_blocks(LlamaForCausalLM(config))
    with pytest.raises(ValueError, match="llama"):
        get_backbone_spec(config)


def test_vit_pools_cls_after_final_layernorm() -> None:
    model = _build("vit").eval()
    inputs = _inputs("vit")
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state[:, 0]
        assert torch.equal(pooled(model, **inputs), expected)


def _padded_vs_alone(model: nn.Module, ids: list[list[int]], pad_id: int) -> None:
    """Features of each sequence alone == its features in a right-padded batch."""
    extractor = functools.partial(pooled, model.eval())
    width = max(map(len, ids))
    batch = torch.tensor([seq + [pad_id] * (width - len(seq)) for seq in ids])
    mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in ids])
    with torch.no_grad():
        together = extractor(input_ids=batch, attention_mask=mask)
        for row, seq in enumerate(ids):
            alone = extractor(
                input_ids=torch.tensor([seq]), attention_mask=torch.ones(1, len(seq))
            )
            torch.testing.assert_close(together[row], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_pooling_ignores_padding(family: str, attn: str) -> None:
    _padded_vs_alone(_build(family, attn), [[5, 6, 7, 8, 9, 10], [11, 12]], pad_id=0)


@pytest.mark.parametrize("attn, dtype", [("sdpa", torch.bool), ("eager", torch.float32)])
def test_attention_mask_format_seen_by_attention(attn: str, dtype: torch.dtype) -> None:
    """Pins the mask a wrapper of ``spec.attention`` receives (see backbones docstring)."""
    seen: dict[str, torch.Tensor] = {}

    def record(family: str):
        def hook(_module, args, kwargs) -> None:
            seen[family] = args[1] if len(args) > 1 else kwargs["attention_mask"]
        return hook

    for family in ("bert", "gpt2"):
        model = _build(family, attn)
        spec = get_backbone_spec(model)
        module = get_block_part(get_blocks(model)[0], spec, "attention")
        module.register_forward_pre_hook(record(family), with_kwargs=True)
        pooled(model, **_inputs(family))
        assert seen[family].dtype == dtype and seen[family].shape == (2, 1, 4, 4)


def test_minilm_loads_offline_with_mean_pooling() -> None:
    model, tokenizer = load_backbone(offline_model_path("minilm"), modality="text")
    assert isinstance(model, BertModel)
    sentences = ["A man is playing a guitar.", "Someone plays a guitar on stage tonight.",
                 "The stock market fell sharply."]
    extractor = functools.partial(pooled, model.eval())
    with torch.no_grad():
        batch = extractor(**tokenizer(sentences, padding=True, return_tensors="pt"))
        alone = extractor(**tokenizer(sentences[:1], return_tensors="pt"))
    assert batch.shape == (3, 384)
    torch.testing.assert_close(batch[0], alone[0], atol=1e-5, rtol=1e-5)
    cos = nn.functional.cosine_similarity
    assert cos(batch[0], batch[1], dim=0) > cos(batch[0], batch[2], dim=0) + 0.2


def test_load_backbone_rejects_wrong_modality() -> None:
    with pytest.raises(ValueError, match="not 'image'"):
        load_backbone(offline_model_path("minilm"), modality="image")
    with pytest.raises(KeyError, match="minilm"):
        offline_model_path("nope")


def test_char_tokenizer_round_trip(tmp_path) -> None:
    tokenizer = CharTokenizer.from_corpus(CORPUS, extra_chars="é")
    text = "To be, or not to be: é\n"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text) and tokenizer.decode(ids) == text
    assert tokenizer.encode("xZ") == [tokenizer.unk_token_id] * 2
    assert tokenizer(["ab"], return_tensors="pt").keys() == {"input_ids", "attention_mask"}
    tokenizer.save_pretrained(tmp_path)
    reloaded = (CharTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path))
    for loaded in reloaded:
        assert isinstance(loaded, CharTokenizer)
        assert loaded.get_vocab() == tokenizer.get_vocab()
        assert loaded.decode(loaded.encode(text)) == text


def test_char_lm_loads_and_generates(tmp_path) -> None:
    tokenizer = CharTokenizer.from_corpus(CORPUS)
    _tiny_char_lm(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, loaded_tok = load_backbone(tmp_path, modality="lm")
    assert isinstance(model, GPT2LMHeadModel) and isinstance(loaded_tok, CharTokenizer)
    prompt = loaded_tok(["To be"], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert out.shape == (1, 11)
    assert loaded_tok.decode(out[0]).startswith("To be")


def test_classifier_growth_keeps_old_logits_and_masks() -> None:
    head = IncrementalClassifier(8, 2, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 8)
    before, old_weight = head(x), head.weight.detach().clone()
    head.grow(5, generator=torch.Generator().manual_seed(1))
    after = head(x)
    # The old rows are kept bit for bit; their logits agree up to rounding (a 2- and a 5-column
    # matmul may take different BLAS kernels on some CPUs).
    assert head.num_classes == 5 and torch.equal(head.weight[:2].detach(), old_weight)
    torch.testing.assert_close(after[:, :2], before, rtol=1e-6, atol=1e-6)
    twin = IncrementalClassifier(8, 2, generator=torch.Generator().manual_seed(0))
    twin.grow(5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(twin(x), after)  # growth is deterministic given the generator
    masked = task_mask_logits(after, [0, 3])
    assert torch.isinf(masked[:, [1, 2, 4]]).all()
    assert torch.equal(masked[:, [0, 3]], after[:, [0, 3]])
    with pytest.raises(ValueError):
        head.grow(3)


def test_classifier_loads_after_growing_to_the_checkpoint_size() -> None:
    head = IncrementalClassifier(8, 4)
    fresh = IncrementalClassifier(8)
    with pytest.raises(RuntimeError, match="size mismatch"):  # grown first, as CLModel.load_extra_state does
        fresh.load_state_dict(head.state_dict())
    fresh.grow(4)
    fresh.load_state_dict(head.state_dict())
    x = torch.randn(2, 8)
    assert fresh.num_classes == 4 and torch.equal(fresh(x), head(x))
