"""QOA as a head on a frozen backbone's pooled features.

The buffer is a :class:`~hf_clroute.core.replay_buffer.ReservoirBuffer` of
(features, label); being an ``nn.Module`` with tensor buffers, it is saved with
the adapter. The support set is ``support_per_class`` items of every class in
the buffer, in training and at evaluation alike (a scorer trained on one support
size and evaluated on another is judged on a softmax it never saw; a class-blind
draw hands the scorer the reservoir's class proportions as a prior). Every draw
comes from a generator seeded by (seed, purpose, items seen so far), so runs,
resumed runs and a loaded adapter see the same supports with no RNG state to
carry. Besides the current batch, ``replay_queries`` buffer items are training
queries each step, each with its own slot masked out of the support (else it
would find itself at cosine 1); without them every training query belongs to
the current task and the scorer learns to favour the newest classes. Each
trained batch is added to the buffer in ``after_step`` (gathered from all
processes first, so every process holds the same buffer). Evaluation is chunked
over queries; its cost is linear in the support size. The logits are
log-probabilities over the classes seen so far.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hf_clroute.core.method import FeatureMemoryMethod, StepContext, seeded_init
from hf_clroute.methods.qoa.config import QoaConfig
from hf_clroute.methods.qoa.head import (
    build_scorer,
    class_balanced_indices,
    classification_log_probs,
    support_generator,
)

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel
    from hf_clroute.data.experiences import Experience

# Purposes of the seeded draws: training support, evaluation support, replayed queries.
_TRAIN, _EVAL, _REPLAY = 0, 1, 2


class Qoa(FeatureMemoryMethod):
    config_class = QoaConfig

    def __init__(self, config: QoaConfig) -> None:
        if config.task != "classification":
            raise ValueError("QoaConfig.task must be 'classification' for the QOA head (regression is standalone only)")
        super().__init__(config)

    def attach(self, model: "CLModel") -> None:
        # The scorer's init depends on the config's seed only, and leaves the global RNG as it was.
        with seeded_init(self.config.seed):
            self.scorer = build_scorer(self.config, model.spec.hidden_size(model.backbone))

    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        needed = max(experience.classes) + 1
        if needed > self.config.max_classes:
            raise ValueError(f"QoaConfig.max_classes={self.config.max_classes} is too small for class id {needed - 1}")
        super().on_task_start(model, experience, ctx)

    def support(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, one-hot labels, buffer slots) of the support set for the current mode."""
        labels = self.buffer.contents()["labels"]
        generator = support_generator(self.config.seed, _TRAIN if self.training else _EVAL, self.buffer.num_seen)
        if self.config.support_per_class:
            slots = class_balanced_indices(labels, self.config.support_per_class, generator)
        else:
            size = self.config.support_size if self.training else self.config.eval_support_size
            slots = torch.randperm(len(labels), generator=generator)[:size] if size else torch.arange(len(labels))
        slots = slots.to(labels.device)
        features = self.buffer.storage("features")[slots]
        return features, F.one_hot(labels[slots], self.config.max_classes).to(features.dtype), slots

    def predict(self, query: torch.Tensor, query_slots: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probabilities for ``query`` against the current support; ``query_slots``: the buffer
        slots the queries come from, masked out of their own support."""
        support_x, support_y, slots = self.support()
        support_x, support_y = support_x.to(query.dtype), support_y.to(query.dtype)
        if query_slots is None:
            prediction = self.scorer(query, support_x, support_y)
        else:
            prediction = self.scorer(query, support_x, support_y, mask=query_slots[:, None] == slots[None, :])
        return classification_log_probs(
            prediction, self.num_classes, self.scorer.outputs_probabilities, self.config.probability_floor
        )

    def classify(self, model: "CLModel", features: torch.Tensor) -> torch.Tensor:
        if len(self.buffer) == 0:
            # The very first batch has no support: predict uniformly. The zero-weighted term
            # keeps the scorer in the graph, so the first optimiser step is a harmless no-op.
            anchor = sum(p.sum() for p in self.scorer.parameters()) * 0.0
            uniform = -float(torch.log(torch.tensor(self.num_classes)))
            return features.new_full((len(features), self.num_classes), uniform) + anchor
        return self.predict(features)

    def replayed(self) -> int:
        """Buffer queries this step: none until the buffer holds two items (a query masked out of a
        one-item support would have nothing left to attend to)."""
        if not self.training or len(self.buffer) < 2:
            return 0
        return min(self.config.replay_queries, len(self.buffer))

    def loss(self, model: "CLModel", batch: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        # Every training query counts the same: the batch's mean loss is weighted by its share of
        # the queries (else 10 batch queries, all of the current task, would weigh as much as all
        # replayed ones together and pull the scorer towards the newest classes).
        replayed = self.replayed()
        if not self.config.batch_queries and replayed:
            return logits.sum() * 0.0  # buffer queries only: the batch keeps the graph, adds no gradient
        return super().loss(model, batch, logits) * (len(logits) / (len(logits) + replayed))

    def replay_slots(self) -> torch.Tensor:
        """Buffer slots of this step's replayed training queries (uniform over the buffer)."""
        generator = support_generator(self.config.seed, _REPLAY, self.buffer.num_seen)
        return torch.randperm(len(self.buffer), generator=generator)[: self.replayed()]

    def extra_losses(self, model: "CLModel", batch: dict[str, torch.Tensor],
                     logits: torch.Tensor) -> dict[str, torch.Tensor]:
        replayed = self.replayed()
        if not replayed:
            return {}
        slots = self.replay_slots().to(self.buffer.storage("labels").device)
        query = self.buffer.storage("features")[slots].to(logits.dtype)
        log_probs = self.predict(query, query_slots=slots)
        share = replayed / (replayed + (len(logits) if self.config.batch_queries else 0))
        return {"replay": F.nll_loss(log_probs, self.buffer.storage("labels")[slots]) * share}
