"""The minimal model card of an adapter pushed from Python, and the sections every card shares.

``CLModel.push_to_hub`` writes :func:`minimal_card` from the adapter's config alone
(method, base model, labels in head order, what it was trained on, how to load it).
``hf-clroute push`` (the bench) writes a fuller card with the run's results, built on
:func:`card_data`, :func:`labels_markdown`, :func:`history_markdown` and :func:`build_markdown`
so both carry the same Hub metadata (``license``: hf_clroute's own, ``datasets``, the backbone,
tags) and list labels, data licenses, the build commit and the library versions the same way.
Beside the card's ``model-index``, :func:`write_eval_results` writes the Hub's evaluation-results
files (``.eval_results/*.yaml``, one per metric), marked self-reported.
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResultEntry, ModelCardData

from hf_clroute.backbones.catalog import BACKBONES, is_backbone_name
from hf_clroute.core.config import CLConfig
from hf_clroute.core.first_session_config import describe_record

#: the offline sources' Hub dataset ids and licenses (Hub license identifiers), as published by their
#: authors: MNIST under CC BY-SA 3.0, Fashion-MNIST under MIT; the renditions are drawn from them
DATASETS: dict[str, tuple[str, str]] = {
    "mnist": ("ylecun/mnist", "cc-by-sa-3.0"),
    "fashion_mnist": ("zalando-datasets/fashion_mnist", "mit"),
    "mnist_r": ("ylecun/mnist", "cc-by-sa-3.0"),
    "fashion_mnist_r": ("zalando-datasets/fashion_mnist", "mit"),
}
#: the libraries whose versions a card records
LIBRARIES = ("hf_clroute", "torch", "transformers", "peft", "huggingface_hub")
#: the PEFT auto class that loads a PEFT adapter of each task type (None: the base model's class)
PEFT_AUTO_CLASSES = {None: "AutoPeftModel", "FEATURE_EXTRACTION": "AutoPeftModelForFeatureExtraction",
                     "CAUSAL_LM": "AutoPeftModelForCausalLM", "SEQ_CLS": "AutoPeftModelForSequenceClassification"}


def _as_dict(config: CLConfig | dict[str, Any]) -> dict[str, Any]:
    return config.to_dict() if isinstance(config, CLConfig) else dict(config)


#: the Hub's pipeline tag of an adapter on a backbone of each modality
PIPELINE_TAGS = {"image": "image-classification", "text": "text-classification", "lm": "text-generation"}
_MODALITY_TAGS = {"image": "vision", "text": "text", "lm": "text"}


def _is_hub_id(name: str | None) -> bool:
    """A Hub model id (what the Hub accepts as ``base_model``), not a local path or a bench alias."""
    return (bool(name) and name.count("/") == 1 and ":" not in name and not name.startswith((".", "/", "~"))
            and not Path(name).exists())


def card_data(config: CLConfig | dict[str, Any], tags: list[str] | tuple[str, ...] = (),
              datasets: list[str] | tuple[str, ...] = (), **fields: Any) -> ModelCardData:
    """The card's YAML metadata as Hub cards carry it: ``library_name``, ``license`` (hf_clroute's own,
    from the package metadata), ``datasets`` (the Hub ids of ``datasets``, offline source names mapped
    by :data:`DATASETS`, and of the data a committed backbone was pretrained on), ``base_model`` (the
    recorded backbone, when it is a Hub id), ``tags`` (continual-learning, the method, the scenario, the
    modality and backbone family, then ``tags``) and ``pipeline_tag`` (from the backbone's modality,
    read from the recorded fingerprint); ``fields`` are further ``ModelCardData`` fields."""
    data = _as_dict(config)
    base = data.get("base_model_name_or_path")
    model_type = (data.get("base_model_fingerprint") or "").partition(":")[0]
    modality = BACKBONES[model_type].modality if model_type in BACKBONES else None
    all_tags = ["continual-learning", "hf_clroute", data.get("method"), f"{data.get('scenario', 'class')}-incremental",
                _MODALITY_TAGS.get(modality), model_type, *tags]
    hub_datasets = [DATASETS.get(name, (name, None))[0] for name in all_datasets(base, datasets)]
    return ModelCardData(
        library_name="hf_clroute",
        license=package_license(),
        datasets=[d for d in dict.fromkeys(hub_datasets) if _is_hub_id(d)] or None,
        base_model=base if _is_hub_id(base) else None,
        tags=list(dict.fromkeys(tag for tag in all_tags if tag)),
        pipeline_tag=PIPELINE_TAGS.get(modality),
        **fields,
    )


def all_datasets(base: str | None, datasets: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``datasets`` (what the adapter trained on), then the data a committed backbone was pretrained on
    (its ``pretrain_report.json``: the labelled source and the unlabelled target)."""
    names = [str(d) for d in datasets if d]
    if base and is_backbone_name(base) and base.startswith("pretrained-vit:"):
        from hf_clroute.backbones.assets import assets_root

        report = assets_root() / base.split(":", 1)[1] / "pretrain_report.json"
        if report.is_file():
            recipe = json.loads(report.read_text()).get("recipe", {})
            names += [recipe[k] for k in ("source", "target") if recipe.get(k)]
    return list(dict.fromkeys(names))


@lru_cache(maxsize=1)
def package_license() -> str | None:
    """hf_clroute's license as a Hub license id (``apache-2.0``), from the installed package's metadata
    (pyproject's ``license``); None when the package metadata is missing."""
    try:
        meta = package_metadata.metadata("hf_clroute")
    except package_metadata.PackageNotFoundError:
        return None
    value = meta.get("License-Expression") or meta.get("License")
    return value.strip().lower() if value and len(value) < 40 else None


@lru_cache(maxsize=1)
def build_commit() -> str | None:
    """The git commit hf_clroute runs from (``+dirty`` with uncommitted changes to the package), when
    it runs from a git checkout; None for an installed wheel or without git."""
    package = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no", "--", "."],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


def library_versions() -> dict[str, str]:
    """The installed version of each of :data:`LIBRARIES` (absent ones left out)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = package_metadata.version(name)
        except package_metadata.PackageNotFoundError:
            continue
    return versions


def build_markdown(base: str | None, datasets: list[str] | tuple[str, ...] = ()) -> str:
    """The card's licenses and build record: the adapter's license, each dataset's, the commit and versions."""
    own = package_license() or "see the hf_clroute package"
    lines = [f"- **License:** {own} (hf_clroute's); the data it was trained on keeps its own license."]
    for name in all_datasets(base, datasets):
        hub_id, data_license = DATASETS.get(name, (name, None))
        lines.append(f"- **Data:** `{name}` ({hub_id}), license {data_license or 'as published by its authors'}")
    commit = build_commit()
    lines.append(f"- **Built from:** hf_clroute commit `{commit}`" if commit else
                 "- **Built from:** an installed hf_clroute (no git checkout)")
    lines.append("- **Library versions:** " + ", ".join(f"{k} {v}" for k, v in library_versions().items()))
    return "\n".join(lines)


def labels_markdown(config: CLConfig | dict[str, Any]) -> str:
    """A table of the adapter's classes by head id: id, name, the dataset's own label id."""
    data = _as_dict(config)
    id2label = {int(k): v for k, v in (data.get("id2label") or {}).items()}
    if not id2label:
        return ("This adapter records no class labels (it was saved before labels were recorded, "
                "or is a language model).")
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


def files_markdown(peft_format: bool | str) -> str:
    """What the repo's files are: hf_clroute's format, or PEFT's with ours beside it (``peft_format``: True,
    or the PEFT auto class that loads it, see :func:`peft_auto_class`)."""
    transformers_note = ("It is an adapter, not a model: `transformers.AutoModel` finds no `config.json` in it "
                         "and cannot load it; `hf_clroute.AutoCLModel` loads it with its backbone.")
    if not peft_format:
        return ("The repo holds only what the method adds or trains (`hf_clroute_config.json` + "
                f"`hf_clroute_model.safetensors`); the backbone loads from its own checkpoint. {transformers_note}")
    auto = peft_format if isinstance(peft_format, str) else "AutoPeftModel"
    return ("The method is PEFT's, and the repo is a PEFT adapter: `adapter_config.json` + "
            "`adapter_model.safetensors` load with `peft.PeftModel.from_pretrained(backbone, repo_id)` or "
            f"`peft.{auto}.from_pretrained(repo_id)` (the adapted backbone, without the classifier). hf_clroute's "
            "config, head and class statistics lie beside them in `hf_clroute_config.json` + "
            "`hf_clroute_model.safetensors`; the backbone loads from its own checkpoint.")


def peft_auto_class(task_type: str | None) -> str:
    """The PEFT auto class for a PEFT config's ``task_type``: PEFT's ``AutoPeftModel`` refuses a config with
    a task type (prompt tuning's is FEATURE_EXTRACTION), and needs the class of that task."""
    return PEFT_AUTO_CLASSES.get(task_type, "AutoPeftModel")


def minimal_card(config: CLConfig, repo_id: str, peft_format: bool | str = False,
                 datasets: list[str] | tuple[str, ...] = ()) -> str:
    """A README.md for the Hub from the adapter's config: metadata, labels, history, usage, build record."""
    base = config.base_model_name_or_path
    if _is_hub_id(base) or (base and is_backbone_name(base)):
        usage = f"""from hf_clroute import AutoCLModel

model, processor = AutoCLModel.from_pretrained("{repo_id}", return_processor=True)  # with its backbone, {base}"""
    else:
        usage = f"""from hf_clroute.backbones.catalog import load_backbone
from hf_clroute.core.model import CLModel

backbone, processor = load_backbone("{base}")
model = CLModel.from_pretrained(backbone, "{repo_id}")"""
    return f"""---
{card_data(config, datasets=datasets).to_yaml()}
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

## License and build

{build_markdown(base, datasets)}
"""


# ---- the Hub's evaluation-results files: .eval_results/*.yaml in the model repo ----
#: the folder the Hub reads evaluation results from, in a model repo
EVAL_RESULTS_DIR = ".eval_results"
#: results.json metric -> what it is, for the files' notes (a results.json row holds mean and std over seeds)
EVAL_METRICS: dict[str, str] = {
    "A_T": "final average accuracy A_T",
    "A_bar": "average incremental accuracy",
    "F_T": "forgetting F_T",
    "BWT": "backward transfer BWT",
    "FWT": "forward transfer FWT",
    "A_AUC": "anytime accuracy A_AUC",
    "deep_forgetting": "deep forgetting (linear probe over seen classes)",
    "probe_A_T": "linear probe final average accuracy",
}


def benchmark_dataset(results: dict[str, Any]) -> str | None:
    """The Hub id of the dataset a run's suite draws from (:data:`DATASETS`: ``ylecun/mnist`` for the MNIST
    suites and their renditions, ``zalando-datasets/fashion_mnist`` for Fashion-MNIST); None when it has none."""
    name = str((results.get("config") or {}).get("dataset") or "")
    hub_id = DATASETS.get(name, (name, None))[0]
    return hub_id if _is_hub_id(hub_id) else None


def eval_result_entries(results: dict[str, Any], method: str, *, dataset_id: str | None = None,
                        source_url: str | None = None) -> dict[str, EvalResultEntry]:
    """One evaluation-results entry per metric of ``method``'s row in a run's ``results`` (results.json),
    keyed by its file name under :data:`EVAL_RESULTS_DIR` (``<suite>_<metric>.yaml``).

    Each names the benchmark dataset (``dataset_id``, default :func:`benchmark_dataset`), a task id
    ``<suite>_<metric>`` (one leaderboard per suite and metric), the value (the mean over seeds, rounded as
    the card's ``model-index`` rounds it) and notes that say it is self-reported by hf_clroute, with the
    seeds and their spread; no ``verifyToken``, so the Hub never shows it as verified. ``source_url``: where
    the run's full results live (e.g. its ``hf-clroute push-results`` dataset). Empty when the suite's
    dataset has no Hub id (then no file is written; the card's ``model-index`` still carries the figures)."""
    dataset_id = dataset_id or benchmark_dataset(results)
    if dataset_id is None:
        return {}
    if not _is_hub_id(dataset_id):
        raise ValueError(f"benchmark dataset {dataset_id!r} is not a Hub dataset id (namespace/name)")
    row, suite = results["methods"][method], str(results.get("suite") or "suite")
    config = results.get("config") or {}
    seeds = ", ".join(map(str, results.get("seeds") or []))
    entries = {}
    for key, label in EVAL_METRICS.items():
        value = row.get(key)
        if not isinstance(value, dict) or value.get("mean") is None:
            continue
        spread = f" (std {value['std']:.4f})" if value.get("std") is not None else ""
        notes = (f"self-reported by hf_clroute (not verified): {label} of {method} on the {suite} suite "
                 f"({config.get('scenario', 'class')}-incremental, {config.get('n_tasks', '?')} tasks drawn from "
                 f"{dataset_id}), mean over seeds {seeds}{spread}, as a fraction (1 = 100%)")
        entries[f"{suite}_{key}.yaml"] = EvalResultEntry(
            dataset_id=dataset_id, task_id=f"{suite}_{key}", value=round(value["mean"], 4), notes=notes,
            source_url=source_url, source_name="hf_clroute benchmark results" if source_url else None)
    return entries


def write_eval_results(folder: str | Path, results: dict[str, Any], method: str, **kwargs: Any) -> list[Path]:
    """Write :func:`eval_result_entries` (``kwargs`` go to it) as ``folder/.eval_results/*.yaml``, one file per
    metric in the Hub's format (a list of one entry); returns the files written."""
    import yaml  # a dependency of huggingface_hub
    from huggingface_hub import eval_result_entries_to_yaml

    from hf_clroute.hub.io import atomic_write_text

    written = []
    for name, entry in eval_result_entries(results, method, **kwargs).items():
        path = Path(folder) / EVAL_RESULTS_DIR / name
        atomic_write_text(path, yaml.safe_dump(eval_result_entries_to_yaml([entry]), sort_keys=False,
                                               allow_unicode=True))
        written.append(path)
    return written
