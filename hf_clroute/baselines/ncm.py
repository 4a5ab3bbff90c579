"""Nearest-class-mean on frozen features.

A strong baseline for frozen pretrained backbones: each class is the running
mean of its features; prediction is the most similar mean. Nothing is trained,
so nothing is forgotten; how good it is says how good the features are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..config import CLConfig
from ..methods.base import ContinualMethod, StepContext

if TYPE_CHECKING:  # pragma: no cover
    from ..data.streams import Experience
    from ..model import CLModel


@dataclass
class NCMConfig(CLConfig):
    method = "ncm"

    metric: str = field(default="cosine", metadata={"help": "'cosine' similarity or negative 'euclidean' distance."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError("NCMConfig.freeze_backbone must be True: class means need fixed features")
        if self.metric not in ("cosine", "euclidean"):
            raise ValueError(f"NCMConfig.metric must be 'cosine' or 'euclidean', got {self.metric!r}")


class NearestClassMean(ContinualMethod):
    config_class = NCMConfig
    uses_head = False

    def __init__(self, config: NCMConfig) -> None:
        super().__init__(config)
        # float64 sums: millions of additions in float32 would drift between 1 and N processes.
        self.register_buffer("class_sums", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("class_counts", torch.zeros(0, dtype=torch.float64))
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def attach(self, model: "CLModel") -> None:
        self.class_sums = torch.zeros(0, model.spec.hidden_size(model.backbone), dtype=torch.float64)

    @property
    def num_classes(self) -> int:
        return self.class_counts.numel()

    def _grow(self, num_classes: int) -> None:
        extra = num_classes - self.num_classes
        if extra > 0:
            dim = self.class_sums.shape[1]
            self.class_sums = torch.cat([self.class_sums, self.class_sums.new_zeros(extra, dim)])
            self.class_counts = torch.cat([self.class_counts, self.class_counts.new_zeros(extra)])

    def classify(self, model: "CLModel", features: torch.Tensor) -> torch.Tensor:
        means = (self.class_sums / self.class_counts.clamp_min(1).unsqueeze(1)).to(features.dtype)
        if self.config.metric == "cosine":
            scores = F.normalize(features, dim=-1) @ F.normalize(means, dim=-1).T
        else:
            scores = -torch.cdist(features, means)
        # A class with no examples yet can never be predicted.
        return scores.masked_fill(self.class_counts.unsqueeze(0) == 0, float("-inf"))

    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        self._grow(max(experience.classes) + 1)

    def after_step(self, model, batch, out, ctx: StepContext) -> None:
        features = out.features.to(torch.float64)
        labels = batch["labels"]
        sums = torch.zeros_like(self.class_sums).index_add_(0, labels, features)
        counts = torch.bincount(labels, minlength=self.num_classes).to(torch.float64)
        if self._pending is None:
            self._pending = (sums, counts)
        else:
            self._pending = (self._pending[0] + sums, self._pending[1] + counts)

    def before_evaluation(self, model: "CLModel", ctx: StepContext) -> None:
        # Each process saw its own shard of the batches: sum the statistics over all
        # processes before they are used (every process must call this together).
        sums, counts = self._pending or (torch.zeros_like(self.class_sums), torch.zeros_like(self.class_counts))
        sums, counts = ctx.reduce(sums), ctx.reduce(counts)
        self.class_sums += sums.to(self.class_sums.device)
        self.class_counts += counts.to(self.class_counts.device)
        self._pending = None

    def on_task_end(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        self.before_evaluation(model, ctx)

    def extra_state(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._grow(int(state.get("num_classes", 0)))
