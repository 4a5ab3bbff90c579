"""``Rwf``: Routing without Forgetting as a continual method.

``attach`` puts one :class:`HopfieldRouter` in front of the self-attention of
each routed block (found through ``hf_clroute.backbones``, so ViT, BERT and the
GPT-2 char-LM take the same path). Trained: the routers' query side and the
shared incremental head (LM: its own LM head stays frozen). No task id, no
replay, no per-task state: the prompts are recomputed from the input at every
forward and dropped after the attention. In class-IL the loss is, by default,
cross-entropy over the current task's classes (``current_task_loss``: the base
method's loss, on by default for RwF).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ...backbones import get_blocks
from ..base import ContinualMethod
from .config import RwfConfig
from .hopfield import HopfieldRouter
from .layer import RoutedAttention

if TYPE_CHECKING:  # pragma: no cover
    from ...model import CLModel


class Rwf(ContinualMethod):
    config_class = RwfConfig
    supported_modes = ("online", "offline")
    supported_modalities = ("image", "text", "lm")

    def __init__(self, config: RwfConfig) -> None:
        super().__init__(config)
        self.routers = nn.ModuleDict()  # block index (as str) -> router; saved as method.routers.<i>.*

    def attach(self, model: "CLModel") -> None:
        config, spec = self.config, model.spec
        blocks = get_blocks(model.backbone)
        hidden = spec.hidden_size(model.backbone)
        parent_path, _, attr = spec.attention.rpartition(".")
        for idx in config.resolve_layers(len(blocks)):
            router = HopfieldRouter(hidden, config, seed=config.init_seed * 1_000_003 + idx)
            self.routers[str(idx)] = router
            parent = blocks[idx].get_submodule(parent_path) if parent_path else blocks[idx]
            attention = getattr(parent, attr)
            if isinstance(attention, RoutedAttention):
                raise ValueError(f"block {idx} of this backbone is already routed by another RwF adapter")
            wrapped = RoutedAttention(attention, router, layer_idx=idx, causal=spec.causal, chunk_size=config.causal_chunk_size)
            setattr(parent, attr, wrapped)
        if spec.causal:
            # A KV cache holds attention keys, not the prefix the router pools: decode without one
            # (RoutedAttention refuses incremental steps on a cache with a clear error).
            model.backbone.config.use_cache = False
            generation_config = getattr(model.backbone, "generation_config", None)
            if generation_config is not None:
                generation_config.use_cache = False
