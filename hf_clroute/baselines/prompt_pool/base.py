"""What L2P, DualPrompt and CODA-Prompt share: the frozen query, key matching, one prompted call.

Every forward runs the backbone twice: once frozen, unprompted, in eval mode and without
gradient, for the query (the pooled feature: ViT's [CLS], BERT's mean), then once with the
prompts the method builds from that query. The classifier reads the prompted call's
pooled features (L2P may read its prompt positions instead). Auxiliary terms (a surrogate
loss that pulls the chosen keys toward the query) come back with the logits, inside the
one model call, so they run under DDP like the cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hf_clroute.backbones.catalog import pooled_features
from hf_clroute.baselines.prompt_pool.insertion import PromptInjector
from hf_clroute.core.config import CLConfig
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import CLModelOutput, backbone_inputs, model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

#: prompted forward: (prompts inserted at the input or None, {block: (prefix keys, prefix values)}, aux losses)
Prompts = tuple[torch.Tensor | None, dict[int, tuple[torch.Tensor, torch.Tensor]], dict[str, torch.Tensor]]


@dataclass
class PromptPoolConfig(CLConfig):
    """Fields every key-query prompt method has."""

    pull_weight: float = field(
        default=0.1,
        metadata={"help": "Weight of the surrogate loss sum(1 - cos(query, chosen key)) per sample, which trains the "
                          "keys (the query is frozen); L2P's and DualPrompt's 0.1 (their code's pull coefficient)."},
    )
    init_seed: int = field(
        default=0,
        metadata={"help": "Seed of the prompts' and keys' initialisation, independent of the global RNG."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError(f"{type(self).__name__}.freeze_backbone must be True: prompt methods train prompts, "
                             "keys and the head on a frozen backbone")
        if not isinstance(self.pull_weight, (int, float)) or isinstance(self.pull_weight, bool) or self.pull_weight < 0:
            raise ValueError(f"{type(self).__name__}.pull_weight must be a number >= 0, got {self.pull_weight!r}")

    def _check_length(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive integer, got {value!r}")

    def _check_layers(self, *names: str) -> None:
        for name in names:
            layers = getattr(self, name)
            if layers is not None and (
                not isinstance(layers, list) or not layers or len(set(layers)) != len(layers)
                or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in layers)
            ):
                raise ValueError(f"{type(self).__name__}.{name} must be None or a non-empty list of distinct "
                                 f"block indices >= 0, got {layers!r}")

    def resolve_layers(self, name: str, paper: list[int], num_blocks: int) -> list[int]:
        """The blocks field ``name`` names: as given (each must exist), or None = ``paper``'s blocks that exist."""
        layers = getattr(self, name)
        if layers is None:
            return [i for i in paper if i < num_blocks]
        missing = [i for i in layers if i >= num_blocks]
        if missing:
            raise ValueError(f"{type(self).__name__}.{name} {missing} out of range: the backbone has {num_blocks} "
                             "blocks")
        return sorted(layers)


class PromptPoolMethod(ContinualMethod):
    """Base of the prompt methods: subclasses build their modules in ``build`` and their prompts in ``prompts``."""

    supported_modalities = ("image", "text")
    supported_modes = ("online", "offline")
    unsupported_hint = "(prompt methods need a ViT or BERT encoder)"

    def __init__(self, config: PromptPoolConfig) -> None:
        super().__init__(config)
        self.injector = PromptInjector()
        self.tasks_done = 0  # experiences finished; the current one's index while it trains

    def prompts(self, model: "CLModel", query: torch.Tensor) -> Prompts:
        raise NotImplementedError

    def readout(self, model: "CLModel", hidden: torch.Tensor, inserted: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Features from the prompted call's last hidden state: the backbone's own pooling over its own tokens."""
        tokens = torch.cat([hidden[:, :1], hidden[:, 1 + inserted:]], dim=1) if inserted else hidden
        return pooled_features(model.spec, SimpleNamespace(last_hidden_state=tokens), mask)

    # ---- the two backbone calls ---------------------------------------------------------
    @torch.no_grad()
    def query(self, model: "CLModel", inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, d) pooled features of the frozen, unprompted backbone, in eval mode (no dropout)."""
        was_training = model.backbone.training
        model.backbone.eval()
        try:
            return model.extract_features(inputs).float()
        finally:
            model.backbone.train(was_training)

    def prompted(self, model: "CLModel",
                 inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if "features" in inputs:
            raise ValueError(f"{self.config.method} prompts the backbone: it cannot read precomputed features")
        input_prompts, prefixes, aux = self.prompts(model, self.query(model, inputs))
        call = backbone_inputs(inputs)
        mask = inputs.get("attention_mask")
        inserted = 0 if input_prompts is None else input_prompts.shape[1]
        if inserted and mask is not None:
            ones = mask.new_ones(mask.shape[0], inserted)
            call["attention_mask"] = torch.cat([mask[:, :1], ones, mask[:, 1:]], dim=1)
        with self.injector.active(input_prompts, prefixes):
            hidden = model.backbone(**call).last_hidden_state
        return self.readout(model, hidden, inserted, mask), aux

    # ---- the method's hooks -------------------------------------------------------------
    def features(self, model: "CLModel", inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.prompted(model, inputs)[0]

    def forward(self, model: "CLModel", batch: dict[str, torch.Tensor]) -> CLModelOutput:
        features, aux = self.prompted(model, model_inputs(batch))
        logits = self.classify(model, features)
        out = self.with_loss(model, batch, CLModelOutput(logits=logits, features=features.detach()))
        if out.loss is not None and aux:
            out.losses = {**out.losses, **aux}
            out.loss = sum(out.losses.values())
        return out

    def on_task_end(self, model: "CLModel", experience: Any, ctx: StepContext) -> None:
        self.tasks_done += 1

    def extra_state(self) -> dict[str, Any]:
        return {"tasks_done": self.tasks_done}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.tasks_done = int(state.get("tasks_done", 0))


def cosine_top(query: torch.Tensor, keys: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices (B, n), cosines (B, n)) of each query's ``n`` best-matching keys, best first."""
    similarity = F.normalize(query, dim=-1) @ F.normalize(keys.float(), dim=-1).T
    cosines, indices = similarity.topk(n, dim=-1)
    return indices, cosines


def pull_loss(cosines: torch.Tensor, weight: float) -> dict[str, torch.Tensor]:
    """The surrogate term: ``weight * mean over samples of sum(1 - cos)`` over the chosen keys."""
    return {"pull": weight * (1.0 - cosines).sum(-1).mean()} if weight else {}


def uniform(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """U(-1, 1): the prompt and key initialisation of L2P's and DualPrompt's code."""
    return torch.rand(*shape, generator=generator) * 2 - 1
