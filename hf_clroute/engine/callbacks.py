"""Callbacks: work the loop runs at task ends without knowing what it is (probes, logging).

A callback's records go into ``StreamResult.records[<name>]`` and are saved with
every checkpoint, so a resumed run reports them for the whole stream.
"""

from __future__ import annotations

from typing import Any

# ``trainer`` below is the running ``ContinualTrainer`` (typed Any: the trainer imports this module).


class Callback:
    """Override the hooks you need; each gets the trainer (model, stream, result)."""

    #: key of this callback's records in ``StreamResult.records``.
    name: str = "callback"

    def on_task_end(self, trainer: Any, task_id: int) -> None:
        """After task ``task_id``'s row of the accuracy matrix, before its checkpoint."""

    def records(self, trainer: Any) -> Any:
        """This callback's records so far (creates them on first use)."""
        return trainer.result.records.setdefault(self.name, {})
