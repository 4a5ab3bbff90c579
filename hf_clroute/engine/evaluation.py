"""Evaluation of a continual model on one experience's test split.

Runs on every process under Accelerate: each process scores its shard and
``gather_for_metrics`` drops the samples that were duplicated to even out the
last batch, so the number is the same with 1 or N processes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

from ..data.streams import Experience
from ..heads import task_mask_logits
from ..model import CLModel
from ..outputs import model_inputs


@dataclass
class EvalTimer:
    """Samples and seconds spent in evaluation: the inference throughput."""

    samples: int = 0
    seconds: float = 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def sequence_nll(model: CLModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL and token count per sequence (exact corpus perplexity)."""
    logits = model(**model_inputs(batch)).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2).float(), labels, ignore_index=-100, reduction="none")
    return nll.sum(dim=1), (labels != -100).sum(dim=1)


@torch.no_grad()
def evaluate_experience(
    model: CLModel,
    loader: DataLoader,
    accelerator: Accelerator,
    *,
    task_classes: list[int] | None = None,
    timer: EvalTimer | None = None,
) -> float:
    """Accuracy (fraction) on a classification test split, or perplexity for a causal LM."""
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    total, score, samples = 0.0, 0.0, 0
    for batch in loader:
        if model.spec.modality == "lm":
            nll, tokens = accelerator.gather_for_metrics(sequence_nll(model, batch))
            score, total = score + nll.sum().item(), total + tokens.sum().item()
            samples += tokens.numel()
            continue
        logits = model(**model_inputs(batch)).logits
        unlearnt = max(task_classes or [0]) >= logits.shape[1]
        if logits.shape[1] == 0 or unlearnt:  # the head has no output for this task yet: all wrong
            preds = torch.full_like(batch["labels"], -1)
        else:
            preds = task_mask_logits(logits, task_classes).argmax(dim=-1)
        preds, labels = accelerator.gather_for_metrics((preds, batch["labels"]))
        score += (preds == labels).sum().item()
        total += labels.numel()
        samples += labels.numel()
    if timer is not None:
        timer.samples += samples
        timer.seconds += time.perf_counter() - start
    model.train(was_training)
    if model.spec.modality == "lm":
        return math.exp(score / max(total, 1.0))
    return score / max(total, 1.0)


def test_loader(experience: Experience, collator, batch_size: int, accelerator: Accelerator) -> DataLoader:
    loader = DataLoader(experience.test, batch_size=batch_size, shuffle=False, collate_fn=collator)
    return accelerator.prepare_data_loader(loader)
