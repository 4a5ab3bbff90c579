"""Class labels that travel with an adapter, the transformers way.

An adapter's config records ``id2label`` / ``label2id`` (string keys in JSON, as in
transformers' configs), ``class_order`` (the dataset's own label id of each head
output) and ``training_history`` (the tasks it learned). ``CLModel.begin_task`` fills
them in from each experience (:func:`record_labels`) and refuses an experience that
would give a known head id to another class.

A stream built later (another seed, another dataset, more classes) numbers its
classes 0..K-1 in its own order. :func:`align_stream` renumbers it onto an adapter's
labels by name: a class the adapter knows keeps its id, a new class comes after the
known ones (or, for evaluation, is refused). ``ContinualTrainer`` and
``hf-clroute evaluate`` call it, so a loaded adapter is trained and scored on the
classes it means.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hf_clroute.core.config import CLConfig, LabelMap

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.data.experiences import Experience

__all__ = ["ClassInfo", "align_stream", "copy_labels", "experience_classes", "labels_in_order", "record_labels"]


@dataclass(frozen=True)
class ClassInfo:
    """One class of an experience: its id in the stream, its name and the dataset's own label.

    ``named`` is False when the name is only ``str(id)`` because the experience carries no
    names (no ``ClassLabel``, no ``info['class_names']``): such classes are never matched by name.
    """

    id: int
    name: str
    original: int
    named: bool


def _label_feature(experience: Experience) -> Any:
    features = getattr(getattr(experience, "train", None), "features", None) or {}
    return features.get("label") if hasattr(features, "get") else None


def _info(experience: Experience) -> dict[str, Any]:
    return getattr(experience, "info", None) or {}


def _name(experience: Experience) -> str:
    return str(getattr(experience, "name", None) or f"task {getattr(experience, 'task_id', '?')}")


def experience_classes(experience: Experience) -> list[ClassInfo]:
    """The classes an experience introduces, with names and the dataset's own label ids.

    Names come from ``info['class_names']`` (set by the stream builders), else from the
    ``label`` column's ``ClassLabel``, else ``str(id)``; original ids from
    ``info['original_classes']``, else the ids themselves (domain-incremental streams
    keep the dataset's labels).
    """
    from datasets import ClassLabel

    ids = [int(c) for c in experience.classes]
    info = _info(experience)
    originals = [int(c) for c in info.get("original_classes", ids)]
    names = info.get("class_names")
    named = names is not None
    if names is None:
        feature = _label_feature(experience)
        if isinstance(feature, ClassLabel):
            names = [feature.int2str(c) if 0 <= c < feature.num_classes else str(c) for c in ids]
            named = True
        else:
            names = [str(c) for c in ids]
    if len(names) != len(ids) or len(originals) != len(ids):
        raise ValueError(f"experience {_name(experience)!r}: {len(ids)} classes but {len(names)} class names and "
                         f"{len(originals)} original labels in its info")
    return [ClassInfo(i, str(n), o, named) for i, n, o in zip(ids, names, originals, strict=True)]


def labels_in_order(config: CLConfig) -> list[str]:
    """The adapter's class names by head id (``[]`` when it records none)."""
    if not config.id2label:
        return []
    return [config.id2label.get(i, f"<id {i}>") for i in range(max(int(k) for k in config.id2label) + 1)]


def _describe(config: CLConfig) -> str:
    order = f", dataset labels {config.class_order}" if config.class_order else ""
    return f"the adapter's classes by id are {labels_in_order(config)}{order}"


def record_labels(config: CLConfig, experience: Experience, stream: str | None = None) -> None:
    """Add an experience's classes to ``config``'s labels and history; refuse a collision.

    A collision is a head id the adapter knows under another name, or a known name
    arriving under another id: training on it would silently merge two classes. Renumber
    such a stream with :func:`align_stream` first (``ContinualTrainer`` does).
    """
    classes = experience_classes(experience)
    if not classes:
        return
    id2label = LabelMap(config.id2label or {})
    label2id = dict(config.label2id or {})
    for c in classes:
        known = id2label.get(c.id)
        if known is not None and known != c.name:
            raise ValueError(
                f"experience {_name(experience)!r} gives head id {c.id} to class {c.name!r}, but this adapter already "
                f"uses id {c.id} for {known!r} ({_describe(config)}); renumber the stream onto the adapter's labels "
                "with hf_clroute.core.labels.align_stream(stream, model.config) (ContinualTrainer does this for "
                "streams whose classes have names)"
            )
        other = label2id.get(c.name)
        if other is not None and other != c.id:
            raise ValueError(
                f"experience {_name(experience)!r} gives class {c.name!r} head id {c.id}, but this adapter knows it as "
                f"id {other} ({_describe(config)}); renumber the stream with hf_clroute.core.labels.align_stream"
            )
        id2label[str(c.id)] = c.name
        label2id[c.name] = c.id
    order = list(config.class_order or [])
    for c in classes:
        order += [-1] * (c.id + 1 - len(order))
        order[c.id] = c.original
    config.id2label = LabelMap(sorted(id2label.items(), key=lambda kv: int(kv[0])))
    config.label2id = dict(sorted(label2id.items(), key=lambda kv: kv[1]))
    config.class_order = order
    entry = {
        "stream": stream or _info(experience).get("stream") or _name(experience).rsplit("/", 1)[0],
        "task": _name(experience),
        "ids": [c.id for c in classes],
        "classes": [c.name for c in classes],
    }
    history = list(config.training_history or [])
    if not history or history[-1] != entry:  # a run resumed mid-task starts that task again
        history.append(entry)
    config.training_history = history


def copy_labels(source: CLConfig, target: CLConfig) -> None:
    """Give ``target`` the labels and history ``source`` records (resuming from a checkpoint)."""
    for name in ("id2label", "label2id", "class_order", "training_history"):
        setattr(target, name, copy.deepcopy(getattr(source, name)))
    target._normalise_labels()


def align_stream(stream: Sequence[Experience], config: CLConfig, *, allow_new: bool = True,
                 what: str = "the stream") -> list[Experience]:
    """``stream`` with its classes renumbered onto the labels ``config`` records, matched by name.

    A class the adapter knows keeps the adapter's id; with ``allow_new`` a new class gets the
    next free id after the known ones, in stream order (the head grows to it), else it is
    refused with an error naming both class orders. Experiences without class names are left
    as they are (``record_labels`` refuses them if their ids collide). The stream itself is
    returned when nothing changes.
    """
    stream = list(stream)
    if not config.id2label:
        return stream
    label2id = dict(config.label2id or {})
    next_id = max(int(k) for k in config.id2label) + 1
    mapping: dict[int, int] = {}
    names: dict[int, str] = {}
    unknown: list[ClassInfo] = []
    stream_order: list[ClassInfo] = []
    for experience in stream:
        classes = experience_classes(experience)
        if not classes or not all(c.named for c in classes):
            continue
        for c in classes:
            if c.id in mapping:
                if names[mapping[c.id]] != c.name:
                    raise ValueError(f"{what}: class id {c.id} is {names[mapping[c.id]]!r} in one task and "
                                     f"{c.name!r} in {_name(experience)!r}")
                continue
            stream_order.append(c)
            if c.name in label2id:
                mapping[c.id] = label2id[c.name]
            elif allow_new:
                mapping[c.id] = label2id[c.name] = next_id
                next_id += 1
            else:
                unknown.append(c)
                continue
            names[mapping[c.id]] = c.name
    if unknown:
        raise ValueError(
            f"{what} has class(es) {[c.name for c in unknown]} this adapter never learned: {_describe(config)}; "
            f"{what}'s classes in order are {[c.name for c in stream_order]} (dataset labels "
            f"{[c.original for c in stream_order]}). Score it on a stream of the adapter's classes"
        )
    if all(old == new for old, new in mapping.items()):
        return stream
    known = {int(k): v for k, v in config.id2label.items()}
    return [_relabel(e, mapping, {**known, **names}) for e in stream]


def _relabel(experience: Experience, mapping: dict[int, int], names: dict[int, str]) -> Experience:
    from datasets import ClassLabel, Dataset

    if not experience.classes or not all(int(c) in mapping for c in experience.classes):
        return experience
    lookup = np.full(max(mapping) + 1, -1, dtype=np.int64)
    for old, new in mapping.items():
        lookup[old] = new
    feature = ClassLabel(names=[names.get(i, str(i)) for i in range(max(names) + 1)])

    def relabel(ds: Any) -> Any:
        if ds is None or "label" not in (getattr(ds, "column_names", None) or []):
            return ds
        if isinstance(ds, Dataset):
            from hf_clroute.data.labeled import column_array

            labels = lookup[column_array(ds).astype(np.int64)]
            return ds.remove_columns("label").add_column("label", labels, feature=feature)
        return ds.map(lambda row: {"label": int(lookup[int(row["label"])])})

    classes = experience_classes(experience)
    info = {**(experience.info or {}), "stream_class_ids": [c.id for c in classes],
            "class_names": [c.name for c in classes], "original_classes": [c.original for c in classes]}
    return dataclasses.replace(
        experience,
        classes=[int(mapping[int(c)]) for c in experience.classes],
        train=relabel(experience.train),
        test=relabel(experience.test),
        validation=relabel(experience.validation),
        info=info,
    )
