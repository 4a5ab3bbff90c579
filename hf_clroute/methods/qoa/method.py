"""QOA as a head on a frozen backbone's pooled features.

The buffer is a :class:`~hf_clroute.replay_buffer.ReservoirBuffer` of
(features, label); being an ``nn.Module`` with tensor buffers, it is saved with
the adapter. Training draws a fresh support set of ``support_size`` items for
every forward, from a generator seeded by (seed, items seen so far), which
changes after every step, so runs (and resumed runs) are reproducible. Each
trained batch is added to the buffer in ``after_step`` (gathered from all
processes first, so every process holds the same buffer). Evaluation uses the
whole buffer by default (exact and deterministic: a saved adapter predicts
bit-identically after loading), chunked over queries; its cost is linear in the
buffer size. The logits are log-probabilities over the classes seen so far.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ...replay_buffer import ReservoirBuffer
from ..base import ContinualMethod, StepContext, seeded_init
from .config import QoaConfig
from .head import QueryOnlyAttention, classification_log_probs, support_generator

if TYPE_CHECKING:  # pragma: no cover
    from ...data.streams import Experience
    from ...model import CLModel

_TRAIN, _EVAL = 0, 1


class Qoa(ContinualMethod):
    config_class = QoaConfig
    uses_head = False

    def __init__(self, config: QoaConfig) -> None:
        super().__init__(config)
        if config.task != "classification":
            raise ValueError("QoaConfig.task must be 'classification' for the QOA head (regression is standalone only)")
        self.buffer = ReservoirBuffer(config.buffer_size, seed=config.seed)
        self.num_classes = 0

    def attach(self, model: "CLModel") -> None:
        # The scorer's init depends on the config's seed only, and leaves the global RNG as it was.
        with seeded_init(self.config.seed):
            self.scorer = QueryOnlyAttention.from_config(self.config, model.spec.hidden_size(model.backbone))

    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        needed = max(experience.classes) + 1
        if needed > self.config.max_classes:
            raise ValueError(f"QoaConfig.max_classes={self.config.max_classes} is too small for class id {needed - 1}")
        self.num_classes = max(self.num_classes, needed)

    def support(self) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.config.support_size if self.training else self.config.eval_support_size
        generator = support_generator(self.config.seed, _TRAIN if self.training else _EVAL, self.buffer.num_seen)
        items = self.buffer.sample(size, generator) if size else self.buffer.contents()
        labels = F.one_hot(items["labels"], self.config.max_classes).to(items["features"].dtype)
        return items["features"], labels

    def classify(self, model: "CLModel", features: torch.Tensor) -> torch.Tensor:
        if len(self.buffer) == 0:
            # The very first batch has no support: predict uniformly. The zero-weighted term
            # keeps the scorer in the graph, so the first optimiser step is a harmless no-op.
            anchor = sum(p.sum() for p in self.scorer.parameters()) * 0.0
            return features.new_full((len(features), self.num_classes), -float(torch.log(torch.tensor(self.num_classes)))) + anchor
        support_x, support_y = self.support()
        prediction = self.scorer(features, support_x.to(features.dtype), support_y.to(features.dtype))
        return classification_log_probs(
            prediction, self.num_classes, self.scorer.outputs_probabilities, self.config.probability_floor
        )

    def after_step(self, model: "CLModel", batch: dict[str, torch.Tensor], out, ctx: StepContext) -> None:
        # Every process adds the whole global batch, in order, so the buffers stay identical.
        features, labels = ctx.gather(out.features), ctx.gather(batch["labels"])
        self.buffer.add({"features": features.float(), "labels": labels.long()})

    def extra_state(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "buffer": self.buffer.extra_state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.num_classes = int(state.get("num_classes", 0))
        self.buffer.load_extra_state(state.get("buffer", {}))
