"""Score a saved or pushed adapter on every task of a suite (``hf-clroute evaluate``).

The suite's classes are matched to the adapter's by name before anything is scored:
a suite that shares no class name with the adapter is refused (its accuracy would be
chance, silently), and the count of the suite's classes the adapter knows is said.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_clroute.core import labels
from hf_clroute.core.config import CLConfig
from hf_clroute.core.labels import experience_classes, labels_in_order


@dataclass
class ClassMatch:
    """Which of a suite's classes (in stream order) an adapter knows by name."""

    suite: str
    suite_classes: list[str]
    adapter_classes: list[str]
    known: list[str] = field(init=False)

    def __post_init__(self) -> None:
        adapter = set(self.adapter_classes)
        self.known = [name for name in self.suite_classes if name in adapter]

    def describe(self) -> str:
        return (f"adapter knows {len(self.known)} of {len(self.suite_classes)} classes of suite {self.suite}: "
                f"{self.known}")


def match_classes(config: CLConfig, stream: list, suite: str) -> ClassMatch | None:
    """The adapter's classes matched to the stream's by name; None when the adapter records none.

    Raises ValueError, naming both lists, when the suite shares no class name with the adapter.
    """
    adapter = labels_in_order(config)
    if not adapter:
        return None
    match = ClassMatch(suite, [c.name for e in stream for c in experience_classes(e)], adapter)
    if not match.known:
        raise ValueError(
            f"suite {suite!r} shares no class name with this adapter, so every score would be chance: the "
            f"adapter's classes are {adapter}, the suite's are {match.suite_classes}. Evaluate it on a suite "
            "of the classes it learned"
        )
    return match


@dataclass
class Evaluation:
    """Accuracy per task of a suite's stream, with how the classes were matched."""

    suite: str
    seed: int
    tasks: list[str]
    accuracy: list[float]
    examples: list[int]
    match: ClassMatch | None

    @property
    def average(self) -> float:
        """A_T: the mean over tasks."""
        return sum(self.accuracy) / len(self.accuracy)

    @property
    def overall(self) -> float:
        """Accuracy over all test examples together."""
        return sum(a * n for a, n in zip(self.accuracy, self.examples, strict=True)) / sum(self.examples)


def evaluate_adapter(adapter: str | os.PathLike, suite: str | Path, *, seed: int = 0, quick: bool = False,
                     verbose: bool = True, **hub_kwargs: Any) -> Evaluation:
    """Load ``adapter`` (a directory or Hub repo id) on the suite's backbone and score every task of
    the suite's stream for ``seed``. ``verbose`` prints the class match and each task's score."""
    from hf_clroute.bench.harness.suites import (
        SuiteConfig,
        build_stream,
        load_suite_backbone,
    )
    from hf_clroute.core.method import StepContext
    from hf_clroute.core.model import CLModel
    from hf_clroute.engine import (
        TrainingConfig,
        evaluate_experience,
        make_accelerator,
        test_loader,
    )
    from hf_clroute.hub.io import resolve_pretrained_dir

    say = print if verbose else (lambda *args, **kwargs: None)
    config = SuiteConfig.load(str(suite), quick=quick)
    # The adapter first: a Hub that fails or a missing adapter is said before the backbone loads.
    allow_mismatch = hub_kwargs.pop("allow_backbone_mismatch", False)
    directory = resolve_pretrained_dir(adapter, **hub_kwargs)
    backbone, collator = load_suite_backbone(config)
    model = CLModel._load(backbone, directory, str(adapter), False, allow_mismatch)
    stream = build_stream(config, seed)
    match = match_classes(model.config, stream, config.name)
    if match is not None:
        say(match.describe())
        # The suite's stream for this seed numbers classes in its own order; score them under the
        # adapter's ids, matched by label name (a class the adapter never learned is refused).
        aligned = labels.align_stream(stream, model.config, allow_new=False, what=f"suite {config.name!r} seed {seed}")
        if [e.classes for e in aligned] != [e.classes for e in stream]:
            say("classes matched to the adapter's labels by name "
                f"(the adapter's order: {labels_in_order(model.config)})")
        stream = aligned
    elif verbose:
        print("note: this adapter records no class labels; the stream's class ids are used as they are, which is "
              "right only for the suite and seed it was trained on", file=sys.stderr)
    accelerator = make_accelerator(TrainingConfig())
    model.to(accelerator.device)
    model.before_evaluation(StepContext(task_id=0))
    result = Evaluation(config.name, seed, [], [], [], match)
    for experience in stream:
        loader = test_loader(experience, collator, 256, accelerator)
        classes = experience.classes if model.config.scenario == "task" else None
        result.tasks.append(experience.name)
        result.accuracy.append(evaluate_experience(model, loader, accelerator, task_classes=classes))
        result.examples.append(len(experience.test))
        say(f"{experience.name}: accuracy {result.accuracy[-1] * 100:.2f}%")
    return result
