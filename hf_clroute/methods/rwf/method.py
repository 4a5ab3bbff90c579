"""``Rwf``: Routing without Forgetting as a continual method.

``attach`` puts one :class:`HopfieldRouter` in front of the self-attention of
each routed block (found through ``hf_clroute.backbones.catalog``, so ViT, BERT and the
GPT-2 char-LM take the same path). Trained: the routers' query side and the
shared incremental head (LM: its own LM head stays frozen). No task id, no
replay, no per-task state: the prompts are recomputed from the input at every
forward and dropped after the attention. In class-IL the loss is, by default,
cross-entropy over the current task's classes (``current_task_loss``: the base
method's loss, on by default for RwF).

``train_routers_for_tasks`` stops the routers' training after the first N tasks
(then only the head learns, or nothing, with a statistics head). With a statistics
head the statistics gathered while the routers moved mix many router states: at the
task end where the routers freeze, the engine resets the head and reads the seen
tasks' training streams again under the frozen routers, in eval mode
(``engine.first_session.reaccumulate_statistics``). The cleaner protocol is first-session
adaptation (``adaptation={"on": "first_task", ...}``): the routers train with a
temporary linear head before the stream, freeze, and the statistics head reads the
whole stream from step 0 (``rwf-fsa-slda``, ``rwf-fsa-ranpac``). ``track()``
records each router's routing health (entropy, top weight, how often a prompt
picks the same token) over the forwards run inside it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import nn

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.heads import StatisticsHead
from hf_clroute.methods.rwf.config import RwfConfig
from hf_clroute.methods.rwf.hopfield import HopfieldRouter, RoutingHealth
from hf_clroute.methods.rwf.layer import RoutedAttention

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


class Rwf(ContinualMethod):
    config_class = RwfConfig
    supported_modes = ("online", "offline")
    supported_modalities = ("image", "text", "lm")

    def __init__(self, config: RwfConfig) -> None:
        super().__init__(config)
        self.routers = nn.ModuleDict()  # block index (as str) -> router; saved as method.routers.<i>.*
        self.tasks_done = 0  # experiences finished: the routers freeze after train_routers_for_tasks of them
        self.tracked: dict[str, dict[str, float]] = {}  # the last track() block's health, per routed block

    def attach(self, model: "CLModel") -> None:
        config, spec = self.config, model.spec
        blocks = get_blocks(model.backbone)
        hidden = spec.hidden_size(model.backbone)
        parent_path, _, attr = spec.attention.rpartition(".")
        wants_pretrained = "pretrained" in (config.key_init, config.value_init)
        for idx in config.resolve_layers(len(blocks)):
            pretrained = pretrained_key_value(blocks[idx], spec.attention_qkv, hidden) if wants_pretrained else None
            router = HopfieldRouter(hidden, config, seed=config.init_seed * 1_000_003 + idx, pretrained=pretrained)
            self.routers[str(idx)] = router
            parent = blocks[idx].get_submodule(parent_path) if parent_path else blocks[idx]
            attention = getattr(parent, attr)
            if isinstance(attention, RoutedAttention):
                raise ValueError(f"block {idx} of this backbone is already routed by another RwF adapter")
            wrapped = RoutedAttention(attention, router, layer_idx=idx, causal=spec.causal,
                                      chunk_size=config.causal_chunk_size)
            setattr(parent, attr, wrapped)
        if spec.causal:
            # A KV cache holds attention keys, not the prefix the router pools: decode without one
            # (RoutedAttention refuses incremental steps on a cache with a clear error).
            model.backbone.config.use_cache = False
            generation_config = getattr(model.backbone, "generation_config", None)
            if generation_config is not None:
                generation_config.use_cache = False
        self._freeze_if_done()

    # ---- router training schedule ---------------------------------------------------
    def on_task_end(self, model: "CLModel", experience: Any, ctx: StepContext) -> None:
        self.tasks_done += 1
        self._freeze_if_done()

    def after_step(self, model: "CLModel", batch: dict, out: Any, ctx: StepContext) -> None:
        # The model has just added this batch to a statistics head's sums; while the routers learn
        # through that head, solve it often enough that their loss sees the statistics so far.
        refresh = (ctx.step_in_task + 1) % self.config.head_refresh_steps == 0
        if refresh and isinstance(model.head, StatisticsHead) and self.routers_training:
            model.head.sync(ctx.reduce)

    @property
    def routers_training(self) -> bool:
        return any(p.requires_grad for p in self.routers.parameters())

    def _freeze_if_done(self) -> None:
        limit = self.config.train_routers_for_tasks
        if limit is not None and self.tasks_done >= limit:
            self.routers.requires_grad_(False)

    def extra_state(self) -> dict[str, Any]:
        return {"tasks_done": self.tasks_done}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.tasks_done = int(state.get("tasks_done", 0))
        self._freeze_if_done()

    # ---- routing health -----------------------------------------------------------
    @contextmanager
    def track(self) -> Iterator[None]:
        """Record routing health over the forwards run inside; read it with :meth:`routing_health`."""
        for router in self.routers.values():
            router.health = RoutingHealth()
        try:
            yield
        finally:
            self.tracked = {idx: router.health.summary() for idx, router in self.routers.items()}
            for router in self.routers.values():
                router.health = None

    def routing_health(self) -> dict[str, dict[str, float]]:
        """Per routed block (index as str): ``entropy_ratio``, ``top_weight``, ``same_top_token`` of the
        last :meth:`track` block, and the routing temperature (cosine routing)."""
        def temperature(router: HopfieldRouter) -> dict[str, Any]:
            return {"temperature": router.temperature} if router.routing == "cosine" else {}

        return {idx: {**self.tracked.get(idx, {}), **temperature(router)} for idx, router in self.routers.items()}


def pretrained_key_value(block: nn.Module, qkv_paths: tuple[str, ...], hidden: int) -> tuple[torch.Tensor, ...]:
    """(W_K, W_V, b_V) of a block's own attention, as right-multiplied matrices (K = Z W_K).

    Separate query/key/value ``nn.Linear`` layers (ViT, BERT) store ``out x in`` weights; GPT-2's
    fused ``c_attn`` is a ``Conv1D`` storing ``in x 3*out`` (query, key, value side by side).
    """
    if len(qkv_paths) == 3:
        key, value = block.get_submodule(qkv_paths[1]), block.get_submodule(qkv_paths[2])
        bias = value.bias if value.bias is not None else torch.zeros(hidden)
        return key.weight.T, value.weight.T, bias
    fused = block.get_submodule(qkv_paths[0])
    weight, bias = fused.weight, fused.bias
    return weight[:, hidden:2 * hidden], weight[:, 2 * hidden:], bias[2 * hidden:]
