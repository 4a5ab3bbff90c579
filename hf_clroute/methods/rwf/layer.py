"""``RoutedAttention``: add the routing prompts before self-attention, drop them after.

Wraps a block's self-attention module (``BackboneSpec.attention``), which every
supported family calls as ``attention(hidden_states, mask, ...)`` or with
``attention_mask=`` as a keyword, and which returns ``(output, weights)``:

1. the router pools the R prompts from ``hidden_states`` (the tokens the
   attention would see);
2. the attention runs on ``[tokens; prompts]`` (L + R rows) with the mask
   extended from (B, 1, L, L) to (B, 1, L+R, L+R);
3. rows L.. of the output are dropped, so the block and everything after it
   see exactly the shapes they would without routing. Per-row post-processing
   inside the wrapped module (BERT's residual + LayerNorm) is unaffected.

Who may attend to whom in the extended mask:

* token -> token: the backbone's own mask (None = everything; causal LMs: the
  causal pattern, which a routed layer builds itself because sdpa's implicit
  ``is_causal`` is aligned top-left and would be wrong with extra keys);
* token -> prompt: non-causal, every valid prompt; causal, only the prompts of
  the token's own chunk (pooled from positions <= the chunk's start <= t);
* prompt -> prompt of the same group only, prompt -> token never: prompt rows
  are dropped, they just must not be empty (an all-masked row is NaN in sdpa).

The mask keeps the backbone's format: boolean (True = attend) under sdpa,
additive float (0 / dtype min) under eager.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hf_clroute.backbones.catalog import AttentionWrapper, FixedInEval
from hf_clroute.methods.rwf.hopfield import HopfieldRouter


class RoutedAttention(AttentionWrapper, FixedInEval):
    """A self-attention module with Hopfield routing prompts (see the module docstring)."""

    def __init__(self, base_layer: nn.Module, router: HopfieldRouter, *, layer_idx: int, causal: bool,
                 chunk_size: int) -> None:
        super().__init__()
        self.base_layer = base_layer
        # The method owns the router (it is saved under ``method.``); keep a plain
        # reference here so its tensors are not registered twice.
        self.__dict__["router"] = router
        self.layer_idx = layer_idx
        self.causal = causal
        self.chunk_size = chunk_size

    def fixed_state(self) -> list[torch.Tensor] | None:
        """The router's tensors, once frozen: the routed attention is then a fixed function of the
        tokens (the routing-health tracker only reads its weights)."""
        tensors = [*self.router.parameters(), *self.router.buffers()]
        return None if any(t.requires_grad for t in tensors) else tensors

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        mask = args[0] if args else kwargs.get("attention_mask")
        cache = kwargs.get("cache")
        if cache is not None and cache.get_seq_length(self.layer_idx) > 0:
            raise NotImplementedError(
                "RwF routing pools the whole prefix at every step, which a KV cache does not hold: "
                "run generate(..., use_cache=False)"
            )
        length = hidden_states.shape[1]
        key_valid = _key_validity(mask)
        prompts, prompt_valid = self.router(hidden_states, key_valid, self.chunk_size if self.causal else None)
        extended = self._extend_mask(mask, prompt_valid, length, hidden_states.dtype)
        if args:
            args = (extended, *args[1:])
        else:
            kwargs["attention_mask"] = extended
        outputs = self.base_layer(torch.cat([hidden_states, prompts.to(hidden_states.dtype)], dim=1), *args, **kwargs)
        if cache is not None:  # the attention cached prompt keys/values after the tokens': drop them
            getattr(cache, "self_attention_cache", cache).layers[self.layer_idx].crop(-prompts.shape[1])
        weights = outputs[1][..., :length, :] if len(outputs) > 1 and outputs[1] is not None else None
        return (outputs[0][:, :length], weights, *outputs[2:])

    def _extend_mask(
        self, mask: torch.Tensor | None, prompt_valid: torch.Tensor, length: int, dtype: torch.dtype
    ) -> torch.Tensor | None:
        """The (B, 1, L+R, L+R) mask for [tokens; prompts], in the backbone's format."""
        if mask is None and not self.causal and bool(prompt_valid.all()):
            return None  # everyone attends everyone, as without routing
        device, num_prompts = prompt_valid.device, prompt_valid.shape[1]
        if mask is None:
            tokens = torch.ones(1, 1, length, length, dtype=torch.bool, device=device)
            if self.causal:
                tokens = tokens.tril()
        else:
            tokens = _as_bool(mask)
        batch = max(tokens.shape[0], prompt_valid.shape[0])
        # Group of each token row and prompt column: all 0 unless causal (chunk index).
        m = self.router.num_prompts
        if self.causal:
            token_group = torch.arange(length, device=device) // self.chunk_size
            prompt_group = torch.arange(num_prompts, device=device) // m
        else:
            token_group = torch.zeros(length, dtype=torch.long, device=device)
            prompt_group = torch.zeros(num_prompts, dtype=torch.long, device=device)
        token_to_prompt = (token_group[:, None] == prompt_group[None, :])[None, None] & prompt_valid[:, None, None, :]
        prompt_to_prompt = (prompt_group[:, None] == prompt_group[None, :])[None, None]
        top = torch.cat(
            [tokens.expand(batch, 1, length, length), token_to_prompt.expand(batch, 1, length, num_prompts)], dim=-1)
        bottom = torch.cat(
            [torch.zeros(batch, 1, num_prompts, length, dtype=torch.bool, device=device),
             prompt_to_prompt.expand(batch, 1, num_prompts, num_prompts)],
            dim=-1,
        )
        allowed = torch.cat([top, bottom], dim=-2)
        if self._wants_float_mask(mask):
            return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        return allowed

    def _wants_float_mask(self, mask: torch.Tensor | None) -> bool:
        if mask is not None:
            return mask.dtype != torch.bool
        config = getattr(self.base_layer, "config", None)
        return getattr(config, "_attn_implementation", "sdpa") == "eager"


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    """True = attend, from a boolean or an additive float mask."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _key_validity(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, L) True for real (non-padding) tokens, read from a (B, 1, L, L) mask.

    The last query row is used: in a padding mask every real query sees every
    real key, and in a causal mask the last position sees all earlier real
    tokens; rows of padding queries, which transformers may unmask to avoid
    NaN, are never the only evidence.
    """
    if mask is None:
        return None
    return _as_bool(mask)[:, 0, -1, :]
