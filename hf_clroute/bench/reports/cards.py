"""Model cards for pushed adapters, from ``hf_clroute/model_cards/adapter_card.md``.

Evaluation results go into the card's ``model-index`` metadata through
``huggingface_hub.ModelCardData`` / ``EvalResult``, so the Hub (and
``huggingface_hub.metadata_load``) reads them as structured results, beside the
metadata every adapter card carries (``hf_clroute.core.model_card.card_data``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard

from hf_clroute.bench.harness.settings import method_description
from hf_clroute.core.model_card import (
    DATASETS,
    build_markdown,
    card_data,
    files_markdown,
    history_markdown,
    labels_markdown,
)

TEMPLATE = Path(__file__).resolve().parents[1] / "model_cards" / "adapter_card.md"

#: results.json key -> (model-index metric type, readable name)
CARD_METRICS = {
    "A_T": ("accuracy", "final average accuracy A_T"),
    "A_bar": ("accuracy", "average incremental accuracy"),
    "F_T": ("forgetting", "forgetting F_T"),
    "BWT": ("backward_transfer", "backward transfer BWT"),
    "FWT": ("forward_transfer", "forward transfer FWT"),
    "A_AUC": ("accuracy", "anytime accuracy A_AUC"),
    "deep_forgetting": ("forgetting", "deep forgetting (linear probe over seen classes)"),
    "probe_A_T": ("accuracy", "linear probe final average accuracy"),
}
LIMITATIONS = (
    "Measured at small scale on CPU with the suite's stated sizes; a different backbone, stream "
    "length or data size can change the ranking of methods. Continual-learning results depend on "
    "the class order: the table reports the spread over seeds, each with its own order."
)


def build_card(results: dict[str, Any], method: str, repo_id: str, adapter_config: dict[str, Any], plots: list[str],
               peft_format: bool | str = False) -> ModelCard:
    """``adapter_config``: the adapter's own config as a dict (``CLConfig.to_dict()``); ``peft_format``:
    whether its directory is in PEFT's format (see ``CLModel.save_pretrained``), or the PEFT auto class
    that loads it. The card carries the package's license, the suite's dataset (and the data a committed
    backbone was pretrained on) with their licenses, the build commit and the library versions."""
    row = results["methods"][method]
    config = results["config"]
    base_model = adapter_config.get("base_model_name_or_path") or config.get("backbone", "")
    datasets = [str(config["dataset"])] if config.get("dataset") else []
    metadata = card_data(adapter_config, tags=[results["suite"]], datasets=datasets, model_name=repo_id)
    eval_results = [
        EvalResult(
            task_type=metadata.pipeline_tag or "text-classification",
            task_name=f"continual learning ({config.get('scenario', 'class')}-incremental)",
            dataset_type=DATASETS.get(str(config.get("dataset")), (str(config.get("dataset")), None))[0],
            dataset_name=results["suite"],
            metric_type=metric_type,
            metric_name=label,
            metric_value=round(row[key]["mean"], 4),
        )
        for key, (metric_type, label) in CARD_METRICS.items()
        if row.get(key)
    ]
    metadata.eval_results = eval_results
    metrics = [(label, f"{row[k]['mean'] * 100:.2f} ± {row[k]['std'] * 100:.2f}")
               for k, (_, label) in CARD_METRICS.items() if row.get(k)]
    training = dict(config.get("training", {}))
    return ModelCard.from_template(
        metadata,
        template_path=str(TEMPLATE),
        model_name=repo_id,
        repo_id=repo_id,
        method=method,
        method_description=method_description(method),
        base_model=base_model,
        files=files_markdown(peft_format),
        suite=results["suite"],
        suite_description=config.get("description", ""),
        n_tasks=config.get("n_tasks"),
        scenario=config.get("scenario", "class"),
        mode="online" if training.get("epochs", 1) == 1 else f"offline ({training['epochs']} epochs per task)",
        seeds=", ".join(map(str, results["seeds"])),
        adapter_seed=results["seeds"][0],
        training=json.dumps(training, sort_keys=True),
        adapter_config=json.dumps(adapter_config, sort_keys=True),
        trainable_params=row.get("trainable_params"),
        trainable_pct=f"{row.get('trainable_pct', 0):.2f}",
        metrics=metrics,
        plots=plots,
        labels=labels_markdown(adapter_config),
        history=history_markdown(adapter_config),
        from_adapter=results.get("from_adapter"),
        limitations=LIMITATIONS,
        build=build_markdown(base_model, datasets),
    )
