"""Where prompt methods put their prompts into an unmodified backbone.

Two insertion points, both driven by :class:`PromptInjector`, which a method fills for
one backbone call (``with injector.active(input_prompts, prefixes): backbone(...)``) and
which does nothing otherwise (so the same backbone also gives the frozen query):

* **At the input** (L2P, as VPT): a forward hook on the backbone's ``embeddings`` inserts
  per-sample prompt tokens (B, P, d) right after the first token (ViT's CLS, BERT's
  [CLS]), after the position embeddings; the 2-D attention mask grows to match.
* **Prefix-tuning on keys and values** (DualPrompt, CODA-Prompt): at a chosen block, the
  self-attention sees P extra keys and values, learned directly in the projected space,
  and no extra query. As RwF's ``RoutedAttention`` does, the wrapper appends P rows to the
  attention's input and drops them from its output, so the block around it sees its own
  shapes; here the key and value projections are wrapped too and put the prefix in those
  rows' place. Those rows' own queries attend but their outputs are dropped, so each real
  token attends over ``[its keys; prefix keys]`` and mixes ``[its values; prefix values]``:
  exactly prefix-tuning, for every attention implementation (eager or sdpa) and family
  whose attention projects the (B, L, d) input with separate key and value layers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from hf_clroute.backbones.catalog import AttentionWrapper, BackboneSpec, get_blocks


class PromptInjector:
    """Holds what to insert during one backbone call; installs the hooks and wrappers once."""

    def __init__(self) -> None:
        self.input_prompts: torch.Tensor | None = None  # (B, P, d), inserted after the first token
        self.prefixes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # block -> (keys, values), each (B, P, d)

    @contextmanager
    def active(self, input_prompts: torch.Tensor | None = None,
               prefixes: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None) -> Iterator[None]:
        self.input_prompts, self.prefixes = input_prompts, dict(prefixes or {})
        try:
            yield
        finally:
            self.input_prompts, self.prefixes = None, {}

    # ---- installing ------------------------------------------------------------------
    def install_input(self, backbone: nn.Module) -> None:
        backbone.embeddings.register_forward_hook(self._insert_input)

    def install_prefix(self, backbone: nn.Module, spec: BackboneSpec, layers: list[int]) -> None:
        if len(spec.attention_qkv) != 3:
            raise ValueError(f"prefix prompts need separate key and value projections; {spec.model_type!r} fuses them")
        blocks = get_blocks(backbone)
        parent_path, _, attr = spec.attention.rpartition(".")
        for idx in layers:
            parent = blocks[idx].get_submodule(parent_path) if parent_path else blocks[idx]
            attention = getattr(parent, attr)
            if isinstance(attention, PrefixAttention):
                raise ValueError(f"block {idx} of this backbone already carries prefix prompts")
            wrapped = PrefixAttention(attention, self, idx)
            for kind, path in (("key", spec.attention_qkv[1]), ("value", spec.attention_qkv[2])):
                inner = path.removeprefix(spec.attention + ".")  # relative to the attention module
                owner_path, _, name = inner.rpartition(".")
                owner = attention.get_submodule(owner_path) if owner_path else attention
                setattr(owner, name, _PrefixProjection(getattr(owner, name), wrapped, kind))
            setattr(parent, attr, wrapped)

    # ---- the input hook ----------------------------------------------------------------
    def _insert_input(self, module: nn.Module, args: tuple, embeddings: torch.Tensor) -> torch.Tensor:
        if self.input_prompts is None:
            return embeddings
        prompts = self.input_prompts.to(embeddings.dtype)
        return torch.cat([embeddings[:, :1], prompts, embeddings[:, 1:]], dim=1)


class PrefixAttention(AttentionWrapper):
    """A block's self-attention with the prefix keys/values the injector holds for its block."""

    def __init__(self, base_layer: nn.Module, injector: PromptInjector, layer_idx: int) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.__dict__["injector"] = injector  # shared, not a submodule
        self.layer_idx = layer_idx
        self.__dict__["current"] = None  # (keys, values) while this block's forward runs

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        prefix = self.injector.prefixes.get(self.layer_idx)
        if prefix is None:
            return self.base_layer(hidden_states, *args, **kwargs)
        length, extra = hidden_states.shape[1], prefix[0].shape[1]
        mask = args[0] if args else kwargs.get("attention_mask")
        mask = _extend_mask(mask, extra)
        if args:
            args = (mask, *args[1:])
        else:
            kwargs["attention_mask"] = mask
        rows = hidden_states.new_zeros(hidden_states.shape[0], extra, hidden_states.shape[2])
        self.__dict__["current"] = prefix
        try:
            outputs = self.base_layer(torch.cat([hidden_states, rows], dim=1), *args, **kwargs)
        finally:
            self.__dict__["current"] = None
        weights = outputs[1][..., :length, :] if len(outputs) > 1 and outputs[1] is not None else None
        return (outputs[0][:, :length], weights, *outputs[2:])


class _PrefixProjection(nn.Module):
    """A key or value projection whose last P output rows are the block's prefix (B, P, d)."""

    def __init__(self, base_layer: nn.Module, owner: PrefixAttention, kind: str) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.__dict__["owner"] = owner
        self.index = 0 if kind == "key" else 1

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_modules"]["base_layer"], name)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        projected = self.base_layer(hidden_states)
        prefix = self.owner.current
        if prefix is None:
            return projected
        rows = prefix[self.index]
        return torch.cat([projected[:, : projected.shape[1] - rows.shape[1]], rows.to(projected.dtype)], dim=1)


def _extend_mask(mask: torch.Tensor | None, extra: int) -> torch.Tensor | None:
    """(B, 1, L, L) -> (B, 1, L+P, L+P): every token may attend every prefix; the prefix rows
    attend everything (their outputs are dropped; a row must not be all-masked, sdpa gives NaN)."""
    if mask is None:
        return None
    batch, _, length, _ = mask.shape
    allowed = torch.ones if mask.dtype == torch.bool else torch.zeros  # bool: True = attend; float: additive 0
    right = allowed(batch, 1, length, extra, dtype=mask.dtype, device=mask.device)
    if length == 1:  # one row broadcast over every query: it stays one row
        return torch.cat([mask, right], dim=-1)
    bottom = allowed(batch, 1, extra, length + extra, dtype=mask.dtype, device=mask.device)
    return torch.cat([torch.cat([mask, right], dim=-1), bottom], dim=-2)
