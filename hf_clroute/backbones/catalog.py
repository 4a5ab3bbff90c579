"""Where each supported Hugging Face architecture keeps its parts.

Every method (RwF, MaRS, APN, QOA) and baseline needs to find the same few
things in an unmodified backbone: the base model, its block list, the
self-attention and FFN of a block, and a pooled feature vector. This module is
the *one* place that knows them, as data (:class:`BackboneSpec`, one row per
``config.model_type``), so adding an architecture is adding a row.

Paths are verified against transformers 5.24 (``named_modules()`` of tiny
models; ``tests/test_backbones.py`` pins them). They differ from 4.x: ViT's
blocks are ``vit.layers`` (not ``vit.encoder.layer``) and its attention is one
``ViTAttention`` with ``q_proj/k_proj/v_proj/o_proj``.

How a block calls the module named by ``BackboneSpec.attention`` (5.24), and
what that module receives as ``hidden_states``:

* vit: ``self.attention(h, attention_mask, **kwargs)``; ``h = layernorm_before(x)``.
* bert: ``self.attention(h, attention_mask, cache=..., **kwargs)``; ``h = x`` (post-LN).
* gpt2: ``self.attn(h, cache=..., attention_mask=..., use_cache=..., position_ids=...,
  **kwargs)``; ``h = ln_1(x)``.

All three return ``(output, attn_weights)`` and the block keeps ``[0]``. So a
wrapper ``forward(hidden_states, *args, **kwargs)`` finds the mask as
``args[0] if args else kwargs.get("attention_mask")``. The mask is ``None``
when nothing is masked (ViT always; BERT without padding; GPT-2 under ``sdpa``
without padding, where causality then comes from ``is_causal`` inside the
kernel), else 4-D ``(B, 1, L_q, L_kv)``: boolean (True = attend) under
``sdpa``, additive float (0 / dtype-min) under ``eager`` (GPT-2 ``eager``
always gets the float causal mask).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
import transformers
from torch import nn
from transformers import AutoConfig, BertConfig, GPT2Config, PreTrainedConfig, ViTConfig

from hf_clroute.backbones import (
    char_tokenizer,  # registers CharTokenizer with AutoTokenizer
)
from hf_clroute.backbones.offline_models import OFFLINE_MODELS, offline_model_path

Modality = Literal["image", "text", "lm"]
Pooling = Literal["cls", "mean", "last"]


class UnsupportedBackboneError(ValueError):
    """The model's ``config.model_type`` has no row in :data:`BACKBONES`."""


@dataclass(frozen=True)
class BackboneSpec:
    """Where one architecture family keeps its parts (paths are dotted, for
    ``nn.Module.get_submodule``).

    Block-relative paths start at one element of the block list.
    """

    model_type: str
    modality: Modality
    #: attribute holding the base model in task models (== HF ``base_model_prefix``)
    base_model_attr: str
    #: class name of the base model itself (``ViTModel`` ...)
    base_model_class: str
    #: ``transformers`` auto classes used by :func:`load_backbone`
    auto_model_class: str
    processor_class: str
    #: block list inside the base model
    blocks_path: str
    #: the self-attention module a routing method wraps to add tokens before
    #: attention and drop them after (see the module docstring for its call).
    #: BERT: ``attention`` (``BertAttention`` = ``self`` + ``output``), whose
    #: residual add + LayerNorm are per-token, so dropping the extra rows after
    #: it is exact and the block sees only its own tokens.
    attention: str
    #: q/k/v projections inside the block (GPT-2: one fused Conv1D ``c_attn``)
    attention_qkv: tuple[str, ...]
    #: attention output projection inside the block
    attention_out: str
    #: modules forming the FFN, in call order. ViT/GPT-2: ``mlp`` (input already
    #: layer-normed, residual added by the block). BERT: ``intermediate`` then
    #: ``output``, and ``output(h, attn_out)`` itself adds the residual and applies
    #: LayerNorm (post-LN).
    ffn: tuple[str, ...]
    ffn_in: str
    ffn_out: str
    #: LayerNorm applied before attention / before the FFN (None: post-LN BERT)
    pre_attention_norm: str | None
    pre_ffn_norm: str | None
    #: True when the attention / FFN modules add the residual and normalise
    #: themselves (BERT); False when the block does it (pre-LN ViT, GPT-2)
    post_norm: bool
    #: PEFT ``LoraConfig.target_modules``; GPT-2's Conv1D needs ``fan_in_fan_out=True``
    lora_target_modules: tuple[str, ...]
    lora_fan_in_fan_out: bool
    hidden_size_attr: str
    pooling: Pooling
    #: causal LM: a routing layer must not let a token see later tokens
    causal: bool

    def hidden_size(self, model_or_config: nn.Module | PreTrainedConfig) -> int:
        """The model width, read through this family's config attribute."""
        return int(getattr(_config_of(model_or_config), self.hidden_size_attr))


BACKBONES: dict[str, BackboneSpec] = {
    "vit": BackboneSpec(
        model_type="vit",
        modality="image",
        base_model_attr="vit",
        base_model_class="ViTModel",
        auto_model_class="AutoModel",
        processor_class="AutoImageProcessor",
        blocks_path="layers",
        attention="attention",
        attention_qkv=("attention.q_proj", "attention.k_proj", "attention.v_proj"),
        attention_out="attention.o_proj",
        ffn=("mlp",),
        ffn_in="mlp.fc1",
        ffn_out="mlp.fc2",
        pre_attention_norm="layernorm_before",
        pre_ffn_norm="layernorm_after",
        post_norm=False,
        lora_target_modules=("q_proj", "v_proj"),
        lora_fan_in_fan_out=False,
        hidden_size_attr="hidden_size",
        pooling="cls",
        causal=False,
    ),
    "bert": BackboneSpec(
        model_type="bert",
        modality="text",
        base_model_attr="bert",
        base_model_class="BertModel",
        auto_model_class="AutoModel",
        processor_class="AutoTokenizer",
        blocks_path="encoder.layer",
        attention="attention",
        attention_qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
        attention_out="attention.output.dense",
        ffn=("intermediate", "output"),
        ffn_in="intermediate.dense",
        ffn_out="output.dense",
        pre_attention_norm=None,
        pre_ffn_norm=None,
        post_norm=True,
        lora_target_modules=("query", "value"),
        lora_fan_in_fan_out=False,
        hidden_size_attr="hidden_size",
        pooling="mean",
        causal=False,
    ),
    "gpt2": BackboneSpec(
        model_type="gpt2",
        modality="lm",
        base_model_attr="transformer",
        base_model_class="GPT2Model",
        auto_model_class="AutoModelForCausalLM",
        processor_class="AutoTokenizer",
        blocks_path="h",
        attention="attn",
        attention_qkv=("attn.c_attn",),
        attention_out="attn.c_proj",
        ffn=("mlp",),
        ffn_in="mlp.c_fc",
        ffn_out="mlp.c_proj",
        pre_attention_norm="ln_1",
        pre_ffn_norm="ln_2",
        post_norm=False,
        lora_target_modules=("c_attn",),
        lora_fan_in_fan_out=True,
        hidden_size_attr="n_embd",
        pooling="last",
        causal=True,
    ),
}

#: block parts that :func:`get_block_part` resolves (single-path spec fields)
BLOCK_PARTS = (
    "attention", "attention_out", "ffn_in", "ffn_out", "pre_attention_norm", "pre_ffn_norm",
)


def _config_of(model_or_config: Any) -> PreTrainedConfig:
    """The HF config of a model (or a PEFT wrapper, which forwards ``.config``)."""
    return getattr(model_or_config, "config", model_or_config)


def get_backbone_spec(model_or_config: nn.Module | PreTrainedConfig | str) -> BackboneSpec:
    """The :class:`BackboneSpec` for a model, a config, or a ``model_type`` string."""
    model_type = (
        model_or_config if isinstance(model_or_config, str)
        else getattr(_config_of(model_or_config), "model_type", None)
    )
    if model_type not in BACKBONES:
        raise UnsupportedBackboneError(
            f"unsupported backbone model_type {model_type!r}; "
            f"supported: {', '.join(sorted(BACKBONES))}"
        )
    return BACKBONES[model_type]


def get_base_model(model: nn.Module) -> nn.Module:
    """The base model (``ViTModel``/``BertModel``/``GPT2Model``) of a task model,
    a PEFT-wrapped model, or the base model itself."""
    if hasattr(model, "get_base_model"):  # a peft.PeftModel around the HF model
        model = model.get_base_model()
    spec = get_backbone_spec(model)
    base = getattr(model, spec.base_model_attr, model)
    try:
        base.get_submodule(spec.blocks_path)
    except AttributeError as err:
        raise ValueError(
            f"{type(model).__name__} is a {spec.model_type!r} model but holds no "
            f"{spec.base_model_class} with blocks at {spec.blocks_path!r}"
        ) from err
    return base


class FixedInEval:
    """Mixin of an adapter module (ours) whose eval-mode forward is a fixed function of its input once
    its tensors are frozen: it changes no state in eval mode and reads no statistics the stream moves.
    ``fixed_state()`` lists the tensors it reads that the backbone does not hold ([] when all of them
    lie in the backbone), or returns None while any of them trains. ``CLModel.reads_fixed_features``
    counts only such modules of ours, so the engine may compute a frozen adapter's features once."""

    def fixed_state(self) -> list[torch.Tensor] | None:
        return []


class AttentionWrapper(nn.Module):
    """Base of a module that wraps a backbone block's attention as ``base_layer`` (RwF's routed
    attention, the prompt methods' prefix attention): an attribute the wrapper lacks is read from
    the wrapped attention, so code that reads ``config``, ``layer_idx``... still finds it."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("_modules", {}).get("base_layer")
            if base is None:
                raise
            return getattr(base, name)


def get_blocks(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of any supported model."""
    base = get_base_model(model)
    return base.get_submodule(get_backbone_spec(base).blocks_path)


def get_block_part(block: nn.Module, spec: BackboneSpec, part: str) -> nn.Module | None:
    """A named part of one block (see :data:`BLOCK_PARTS`); ``None`` where the
    family has no such part (e.g. BERT's ``pre_attention_norm``)."""
    if part not in BLOCK_PARTS:
        raise KeyError(f"unknown block part {part!r}; known: {', '.join(BLOCK_PARTS)}")
    path = getattr(spec, part)
    return None if path is None else block.get_submodule(path)


def _cls_pool(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    # ViTModel already applied its final LayerNorm to last_hidden_state.
    return hidden[:, 0]


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    # all-MiniLM-L6-v2 is trained with this pooling (1_Pooling/config.json:
    # pooling_mode_mean_tokens), so padding must not dilute the mean.
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def _last_token_pool(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    # Rightmost attended position: right and left padding both work (as in
    # GPT2ForSequenceClassification).
    if mask is None:
        return hidden[:, -1]
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (positions * (mask != 0)).argmax(dim=-1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


_POOLERS: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    "cls": _cls_pool,
    "mean": _mean_pool,
    "last": _last_token_pool,
}


def pooled_features(
    spec: BackboneSpec, base_model_outputs: Any, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, d) features from a base model's outputs, pooled the family's way:
    ViT the CLS token, BERT the attention-mask-weighted mean, GPT-2 the last
    non-padding token. ``attention_mask`` is the 2-D (B, L) input mask."""
    return _POOLERS[spec.pooling](base_model_outputs.last_hidden_state, attention_mask)


#: parameter prefixes of task heads a base model leaves out when loaded from a task checkpoint
_TASK_HEAD_PREFIXES = ("classifier.", "pre_classifier.", "cls.", "lm_head.", "score.", "qa_outputs.")
_logger = logging.getLogger(__name__)


class _DropLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextmanager
def _without_load_report() -> Iterator[None]:
    """Drop transformers' state-dict "LOAD REPORT" warning (logged by ``transformers.modeling_utils``)
    while the block runs; every other message of that logger still goes through."""
    report_logger = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport()
    report_logger.addFilter(drop)
    try:
        yield
    finally:
        report_logger.removeFilter(drop)


def load_backbone(
    name_or_path: str | os.PathLike,
    *,
    modality: Modality | None = None,
    revision: str | None = None,
    **from_pretrained_kwargs: Any,
) -> tuple[nn.Module, Any]:
    """Load a supported backbone and its processor from a local dir, a Hub id or a backbone name
    of this package (``pretrained-vit:<name>``, ``minilm``: :func:`resolve_backbone_name`).

    ViT/BERT load as base models (``AutoModel``), GPT-2 char-LMs as causal LMs
    (``AutoModelForCausalLM``). The processor is ``AutoImageProcessor`` or
    ``AutoTokenizer``; a dir saved with our ``CharTokenizer`` resolves to it
    because importing this module registers it with ``AutoTokenizer``.
    ``from_pretrained_kwargs`` go to the model (e.g. ``attn_implementation``).
    From the Hub, ``revision`` (default: the main branch) is resolved to its commit once, so config,
    weights and processor come from that one commit, which :func:`loaded_revision` then reports
    (an adapter records it, so ``AutoCLModel`` reloads the very same backbone). A package backbone
    is reported under its name (:func:`loaded_name`) with the sha256 of its committed weights.
    """
    name_or_path = os.fspath(name_or_path)
    identity = (name_or_path, None)
    if is_backbone_name(name_or_path):
        from hf_clroute.backbones.assets import asset_revision

        # The package ships one build per name; a ``revision`` recorded by an adapter (the sha256 of the
        # weights it was saved on) is not looked up here: the adapter's weights fingerprint decides.
        identity, revision = (name_or_path, asset_revision(name_or_path)), None
        name_or_path = resolve_backbone_name(name_or_path)
    else:
        revision = _hub_commit(name_or_path, revision)
        identity = (name_or_path, revision)
    if revision is not None:
        from_pretrained_kwargs["revision"] = revision
    spec = get_backbone_spec(AutoConfig.from_pretrained(name_or_path, revision=revision))
    if modality is not None and modality != spec.modality:
        raise ValueError(
            f"{name_or_path!r} is a {spec.model_type!r} ({spec.modality}) backbone, "
            f"not {modality!r}"
        )
    model_cls = getattr(transformers, spec.auto_model_class)
    # Loading a task checkpoint (a ViTForImageClassification, a BERT with an MLM head) as its base
    # model is what we mean to do: its head is left out (UNEXPECTED) and a pooler it never had is
    # initialised (MISSING), and transformers prints a LOAD REPORT table saying so on every load.
    # Only that report is dropped; any other key it would list is still warned about below.
    with _without_load_report():
        model, info = model_cls.from_pretrained(name_or_path, output_loading_info=True, **from_pretrained_kwargs)
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not k.startswith(_TASK_HEAD_PREFIXES))
    missing = sorted(k for k in info.get("missing_keys", ()) if ".pooler." not in f".{k}")
    if unexpected or missing:
        _logger.warning("%s loaded from %s with unexpected keys %s and missing (newly initialised) keys %s",
                        type(model).__name__, name_or_path, unexpected[:10], missing[:10])
    try:
        processor = getattr(transformers, spec.processor_class).from_pretrained(name_or_path, revision=revision)
    except OSError as err:
        raise OSError(
            f"{name_or_path!r} holds a {spec.model_type!r} model but no "
            f"{spec.processor_class} files; save the processor/tokenizer with "
            f"save_pretrained into the same directory"
        ) from err
    if identity[1] is not None or identity[0] != name_or_path:
        _LOADED_AS[model] = identity
    return model, processor


#: backbone loaded by :func:`load_backbone` from the Hub or by a package backbone name ->
#: (the name it was asked for, the Hub commit or ``sha256:<weights>`` it was loaded at)
_LOADED_AS: "weakref.WeakKeyDictionary[nn.Module, tuple[str, str | None]]" = weakref.WeakKeyDictionary()


def loaded_revision(model: nn.Module) -> str | None:
    """The Hub commit :func:`load_backbone` loaded ``model`` at (``sha256:<hex>`` of the weights for a
    committed ``pretrained-vit:<name>``); None for a local directory or a model built or loaded any
    other way (transformers itself keeps no record of it)."""
    return _LOADED_AS.get(model, (None, None))[1]


def loaded_name(model: nn.Module) -> str | None:
    """The name :func:`load_backbone` was given for ``model`` when it was a Hub id or a package backbone
    name (``pretrained-vit:vit-mnist-stream``, ``minilm``), which an adapter records instead of the
    cache directory it was read from; None otherwise."""
    return _LOADED_AS.get(model, (None, None))[0]


def is_backbone_name(name: str) -> bool:
    """Whether ``name`` is a backbone name this package resolves itself (not a Hub id or a path)."""
    return (name.startswith("pretrained-vit:") or name in OFFLINE_MODELS) and not os.path.isdir(name)


def resolve_backbone_name(name: str) -> str:
    """The directory of a package backbone name, ready to load: ``pretrained-vit:<name>`` (a committed
    asset, installed into the cache or re-verified there, see :mod:`hf_clroute.backbones.assets`) or an
    offline model package (``minilm``). Any other name (a Hub id, a directory) is returned as it is."""
    if name.startswith("pretrained-vit:"):
        from hf_clroute.backbones.assets import resolve_asset

        return resolve_asset(name)
    if name in OFFLINE_MODELS and not os.path.isdir(name):
        return offline_model_path(name)
    return name


def _hub_commit(name_or_path: str, revision: str | None) -> str | None:
    """The commit ``revision`` of Hub repo ``name_or_path`` points to now (None for a local directory).
    Best effort, as transformers' own resolution: when it cannot be resolved (offline and never
    cached, no such repo, no answer in time), ``revision`` is returned and the load itself reports
    the problem."""
    if os.path.isdir(name_or_path):
        return None
    from huggingface_hub import HfApi, constants

    from hf_clroute.hub.io import hub_call

    try:
        return hub_call(lambda: HfApi().resolve_revision(
            name_or_path, revision=revision, local_files_only=constants.HF_HUB_OFFLINE).resolved,
            what=f"backbone {name_or_path!r}", revision=revision)
    except Exception:  # the client raises many types (HTTP, connection, validation, cache miss): fail open
        return revision


def _with_overrides(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults, **overrides}


def vit_image_processor(**kwargs: Any) -> Any:
    """A ViT image processor on the PIL backend (``ViTImageProcessorPil``), made with ``kwargs``.

    In transformers 5 the name ``ViTImageProcessor`` means the torchvision backend; without
    torchvision (this package does not need it) naming it logs a warning and gives the PIL class
    anyway. Asking for the PIL class by its own name does the same with no warning, and gives the
    same preprocessing whether or not torchvision is installed. Its saved config still says
    ``ViTImageProcessor``, which ``AutoImageProcessor`` loads without the warning.
    """
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(**kwargs)


def tiny_vit_config(**overrides: Any) -> ViTConfig:
    """A ViT small enough for unit tests (hidden 32, 2 layers, 16x16 RGB, patch 4)."""
    defaults = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=4, num_channels=3,
    )
    return ViTConfig(**_with_overrides(defaults, overrides))


def tiny_bert_config(**overrides: Any) -> BertConfig:
    """A BERT small enough for unit tests (hidden 32, 2 layers, vocab 100)."""
    defaults = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        vocab_size=100, max_position_embeddings=64, pad_token_id=0,
    )
    return BertConfig(**_with_overrides(defaults, overrides))


def char_lm_config(vocab_size: int, **overrides: Any) -> GPT2Config:
    """A GPT-2 character LM for :class:`CharTokenizer` ids.

    Defaults are the APN paper setup (6 layers x 384, 6 heads, context 256);
    tests override e.g. ``n_embd=32, n_layer=2, n_head=2``. Special-token ids
    follow ``CharTokenizer`` (pad 0, bos 2, eos 3) so ``generate`` pads/stops right.
    """
    special = {t: i for i, t in enumerate(char_tokenizer.SPECIAL_TOKENS)}
    defaults = dict(
        vocab_size=vocab_size, n_positions=256, n_embd=384, n_layer=6, n_head=6,
        pad_token_id=special[char_tokenizer.PAD],
        bos_token_id=special[char_tokenizer.BOS],
        eos_token_id=special[char_tokenizer.EOS],
    )
    return GPT2Config(**_with_overrides(defaults, overrides))
