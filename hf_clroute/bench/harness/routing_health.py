"""Routing health over the stream: does a routing method still route by its input?

After every task, a method that can ``track()`` its routing (RwF) runs over up to
``HEALTH_EXAMPLES_PER_TASK`` test examples of each task seen so far, and the
per-layer record (``entropy_ratio``: routing entropy / log L; ``top_weight``: the
largest routing weight; ``same_top_token``: how often a prompt's top token is
the same position whatever the input; the temperature if routed by cosine) goes
into the run's records. A collapsed router (entropy near 0, top weight near 1,
same top token near 1) pools a fixed token copy, and can add nothing over its
head-only control.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datasets import concatenate_datasets

from hf_clroute.bench.harness.probes import model_features
from hf_clroute.engine import Callback

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.engine import ContinualTrainer

HEALTH_EXAMPLES_PER_TASK = 100
HEALTH_KEYS = ("entropy_ratio", "top_weight", "same_top_token")


def tracks_routing(model: Any) -> bool:
    return callable(getattr(model.method, "track", None)) and callable(getattr(model.method, "routing_health", None))


class RoutingHealthRecorder(Callback):
    """Engine callback: ``records["routing"]`` gets ``{"task", "step", "layers": {block: record}}`` per task."""

    name = "routing"

    def on_task_end(self, trainer: "ContinualTrainer", task_id: int) -> None:
        tests = [e.test.select(range(min(len(e.test), HEALTH_EXAMPLES_PER_TASK)))
                 for e in trainer.stream[: task_id + 1]]
        with trainer.model.method.track():
            model_features(trainer.model, concatenate_datasets(tests), trainer.collator)
        history = trainer.result.records.setdefault(self.name, [])
        history.append({"task": task_id, "step": trainer.result.global_step,
                        "layers": trainer.model.method.routing_health()})


def final_health(history: list[dict[str, Any]]) -> dict[str, float]:
    """The last task's record, averaged over the routed layers: ``routing_<key>`` scalars for the table."""
    layers = list(history[-1]["layers"].values())
    return {f"routing_{key}": sum(r[key] for r in layers) / len(layers) for key in HEALTH_KEYS}
