"""Joint training: the upper bound of a continual benchmark.

The "cumulative" form: at task t the model trains on the union of the training
data of tasks 0..t, shuffled together, so after the last task it has trained on
all data jointly, and every task boundary still gives a row of the T x T accuracy
matrix (a single joint run over all data would give only the last row). Like naive
fine-tuning it trains the backbone and the head; it is not a continual method
(it revisits all past data), only the reference a continual method should approach.
Online (one epoch) it reads each past example once more at every later task.

The "final" form (``schedule="final"``) is the offline upper bound most CL libraries call joint
training: nothing trains before the last task, which then trains on the union of every task.
Its last row is the cumulative form's at a third of the cost over five tasks (T(T+1)/2 task-passes
against T), so it is the form that fits a large backbone; the earlier rows score the untrained
model, so A_bar, F_T, BWT and A_AUC mean nothing there and are reported as n/a
(``undefined_metrics``).
"""

from __future__ import annotations

import torch
from datasets import concatenate_datasets

from hf_clroute.baselines.joint.config import JointConfig
from hf_clroute.core.method import ContinualMethod


class JointTraining(ContinualMethod):
    config_class = JointConfig
    supported_modalities = ("image", "text")

    def __init__(self, config: JointConfig) -> None:
        super().__init__(config)
        self.n_tasks: int | None = None
        # the final form's earlier rows score an untrained model: only its last row means anything
        self.undefined_metrics = ("A_bar", "F_T", "BWT", "A_AUC") if config.schedule == "final" else ()
        # the final form reads one shuffled union ``epochs`` times in the same order (training_stream)
        self.epochs_share_prefix = config.schedule == "final"

    def check_stream(self, n_tasks: int) -> None:
        self.n_tasks = n_tasks

    def _trains_at(self, experience) -> bool:
        """The final form trains only at the last task; the cumulative form at every task."""
        if self.config.schedule != "final":
            return True
        if self.n_tasks is None:
            raise ValueError("JointConfig.schedule='final' needs the stream's length before training "
                             "(ContinualTrainer calls check_stream); call method.check_stream(n_tasks) first")
        return experience.task_id == self.n_tasks - 1

    def training_examples(self, experience, seen, epochs):
        return sum(len(e.train) for e in seen) * epochs if self._trains_at(experience) else 0

    def training_stream(self, experience, seen, epochs):
        if not self._trains_at(experience):
            return experience.train.select([])  # nothing to train before the last task
        # The trainer seeds torch with TrainingConfig.seed at fit(): its initial seed is the run's.
        seed = self.config.shuffle_seed if self.config.shuffle_seed is not None else torch.initial_seed()
        union = concatenate_datasets([e.train for e in seen])
        union = union.shuffle(seed=(seed * 1_000_003 + experience.task_id) % 2**32)
        stream = union.to_iterable_dataset(num_shards=1)
        return stream.repeat(epochs) if epochs > 1 else stream
