"""The minimal model card of an adapter pushed from Python, and the label/history sections
every card shares.

``CLModel.push_to_hub`` writes :func:`minimal_card` from the adapter's config alone
(method, base model, labels in head order, what it was trained on, how to load it).
``hf-clroute push`` (the bench) writes a fuller card with the run's results, built on
:func:`card_data`, :func:`labels_markdown` and :func:`history_markdown` so both carry the
same Hub metadata and list labels the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCardData

from .backbones import BACKBONES
from .adaptation import describe_record
from .config import CLConfig


def _as_dict(config: CLConfig | dict[str, Any]) -> dict[str, Any]:
    return config.to_dict() if isinstance(config, CLConfig) else dict(config)


#: the Hub's pipeline tag of an adapter on a backbone of each modality
PIPELINE_TAGS = {"image": "image-classification", "text": "text-classification", "lm": "text-generation"}
_MODALITY_TAGS = {"image": "vision", "text": "text", "lm": "text"}


def _is_hub_id(name: str | None) -> bool:
    """A Hub model id (what the Hub accepts as ``base_model``), not a local path or a bench alias."""
    return (bool(name) and name.count("/") == 1 and ":" not in name and not name.startswith((".", "/", "~"))
            and not Path(name).exists())


def card_data(config: CLConfig | dict[str, Any], tags: list[str] | tuple[str, ...] = (), **fields: Any) -> ModelCardData:
    """The card's YAML metadata as Hub cards carry it: ``library_name``, ``base_model`` (the recorded
    backbone, when it is a Hub id), ``tags`` (continual-learning, the method, the scenario, the
    modality and backbone family, then ``tags``) and ``pipeline_tag`` (from the backbone's modality,
    read from the recorded fingerprint); ``fields`` are further ``ModelCardData`` fields."""
    data = _as_dict(config)
    base = data.get("base_model_name_or_path")
    model_type = (data.get("base_model_fingerprint") or "").partition(":")[0]
    modality = BACKBONES[model_type].modality if model_type in BACKBONES else None
    all_tags = ["continual-learning", "hf_clroute", data.get("method"), f"{data.get('scenario', 'class')}-incremental",
                _MODALITY_TAGS.get(modality), model_type, *tags]
    return ModelCardData(
        library_name="hf_clroute",
        base_model=base if _is_hub_id(base) else None,
        tags=list(dict.fromkeys(tag for tag in all_tags if tag)),
        pipeline_tag=PIPELINE_TAGS.get(modality),
        **fields,
    )


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


def files_markdown(peft_format: bool) -> str:
    """What the repo's files are: hf_clroute's format, or PEFT's with ours beside it."""
    if not peft_format:
        return ("The repo holds only what the method adds or trains (`adapter_config.json` + "
                "`adapter_model.safetensors`); the backbone loads from its own checkpoint.")
    return ("The method is PEFT's, and the repo is a PEFT adapter: `adapter_config.json` + "
            "`adapter_model.safetensors` load with `peft.PeftModel.from_pretrained(backbone, repo_id)` (the adapted "
            "backbone, without the classifier). hf_clroute's config, head and class statistics lie beside them in "
            "`hf_clroute_config.json` + `hf_clroute_model.safetensors`; the backbone loads from its own checkpoint.")


def minimal_card(config: CLConfig, repo_id: str, peft_format: bool = False) -> str:
    """A README.md for the Hub from the adapter's config: metadata, labels, history, usage."""
    base = config.base_model_name_or_path
    if _is_hub_id(base):
        usage = f"""from hf_clroute import AutoCLModel

model, processor = AutoCLModel.from_pretrained("{repo_id}", return_processor=True)  # with its backbone, {base}"""
    else:
        usage = f"""from hf_clroute.backbones import load_backbone
from hf_clroute.model import CLModel

backbone, processor = load_backbone("{base}")
model = CLModel.from_pretrained(backbone, "{repo_id}")"""
    return f"""---
{card_data(config).to_yaml()}
---

# {repo_id}

A **{config.method}** continual-learning adapter from hf_clroute for the backbone `{base}`
(scenario `{config.scenario}`). {files_markdown(peft_format)}

## Labels

{labels_markdown(config)}

`model.config.id2label[i]` is the name of head output `i`; `model.predict(**inputs)` returns names.

## Training history

{history_markdown(config)}

## How to use

```python
{usage}
print(model.predict(**processor(images=[...], return_tensors="pt")))  # or text=[...] for a text backbone
```
"""
