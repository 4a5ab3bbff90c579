"""Joint training: the upper bound of a continual benchmark.

The "cumulative" form: at task t the model trains on the union of the training
data of tasks 0..t, shuffled together, so after the last task it has trained on
all data jointly, and every task boundary still gives a row of the T x T accuracy
matrix (a single joint run over all data would give only the last row). Like naive
fine-tuning it trains the backbone and the head; it is not a continual method
(it revisits all past data), only the reference a continual method should approach.
Online (one epoch) it reads each past example once more at every later task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from datasets import concatenate_datasets

from ..config import CLConfig
from ..methods.base import ContinualMethod


@dataclass
class JointConfig(CLConfig):
    method = "joint"

    freeze_backbone: bool = field(
        default=False, metadata={"help": "False trains the backbone and head, as naive fine-tuning does."}
    )
    shuffle_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the shuffle of the union; None = the run's seed (TrainingConfig.seed)."},
    )


class JointTraining(ContinualMethod):
    config_class = JointConfig
    supported_modalities = ("image", "text")

    def training_stream(self, experience, seen, epochs):
        # The trainer seeds torch with TrainingConfig.seed at fit(): its initial seed is the run's.
        seed = self.config.shuffle_seed if self.config.shuffle_seed is not None else torch.initial_seed()
        union = concatenate_datasets([e.train for e in seen])
        union = union.shuffle(seed=(seed * 1_000_003 + experience.task_id) % 2**32)
        stream = union.to_iterable_dataset(num_shards=1)
        return stream.repeat(epochs) if epochs > 1 else stream
