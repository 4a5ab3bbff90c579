"""The minimal model card of an adapter pushed from Python, and the label/history sections
every card shares.

``CLModel.push_to_hub`` writes :func:`minimal_card` from the adapter's config alone
(method, base model, labels in head order, what it was trained on, how to load it).
``hf-clroute push`` (the bench) writes a fuller card with the run's results, built on
:func:`labels_markdown` and :func:`history_markdown` so both list labels the same way.
"""

from __future__ import annotations

from typing import Any

from .adaptation import describe_record
from .config import CLConfig


def _as_dict(config: CLConfig | dict[str, Any]) -> dict[str, Any]:
    return config.to_dict() if isinstance(config, CLConfig) else dict(config)


def _is_hub_id(name: str | None) -> bool:
    return bool(name) and name.count("/") == 1 and ":" not in name and not name.startswith((".", "/", "~"))


def labels_markdown(config: CLConfig | dict[str, Any]) -> str:
    """A table of the adapter's classes by head id: id, name, the dataset's own label id."""
    data = _as_dict(config)
    id2label = {int(k): v for k, v in (data.get("id2label") or {}).items()}
    if not id2label:
        return "This adapter records no class labels (it was saved before labels were recorded, or is a language model)."
    order = data.get("class_order") or []
    rows = ["| id | label | dataset label id |", "|---|---|---|"]
    for i in range(max(id2label) + 1):
        original = order[i] if i < len(order) and order[i] >= 0 else ""
        rows.append(f"| {i} | {id2label.get(i, '')} | {original} |")
    return "\n".join(rows)


def history_markdown(config: CLConfig | dict[str, Any]) -> str:
    """What the adapter was trained on, in order: each stream with its tasks and their classes."""
    history = _as_dict(config).get("training_history") or []
    if not history:
        return "No training history recorded."
    lines: list[str] = []
    stream = None
    for entry in history:
        if entry.get("stream") != stream:
            stream = entry.get("stream")
            lines.append(f"- stream `{stream}`:")
        classes = ", ".join(f"{name} (id {i})" for i, name in zip(entry.get("ids", []), entry.get("classes", [])))
        lines.append(f"  - task `{entry.get('task')}`: {classes}")
    adaptation = describe_record(_as_dict(config).get("adaptation_record"))
    return "\n".join(lines + ([f"- {adaptation}"] if adaptation else []))


def minimal_card(config: CLConfig, repo_id: str) -> str:
    """A README.md for the Hub from the adapter's config: metadata, labels, history, usage."""
    from huggingface_hub import ModelCardData

    base = config.base_model_name_or_path
    data = ModelCardData(
        library_name="hf_clroute",
        tags=["continual-learning", "hf_clroute", config.method],
        base_model=base if _is_hub_id(base) else None,
    )
    return f"""---
{data.to_yaml()}
---

# {repo_id}

A **{config.method}** continual-learning adapter from hf_clroute for the backbone `{base}`
(scenario `{config.scenario}`). The repo holds only what the method adds or trains
(`adapter_config.json` + `adapter_model.safetensors`); the backbone loads from its own checkpoint.

## Labels

{labels_markdown(config)}

`model.config.id2label[i]` is the name of head output `i`; `model.predict(**inputs)` returns names.

## Training history

{history_markdown(config)}

## How to use

```python
from hf_clroute.backbones import load_backbone
from hf_clroute.model import CLModel

backbone, processor = load_backbone("{base}")
model = CLModel.from_pretrained(backbone, "{repo_id}")
print(model.predict(**processor(images=[...], return_tensors="pt")))  # or text=[...] for a text backbone
```
"""
