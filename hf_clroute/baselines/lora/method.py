"""LoRA from PEFT itself, as a continual baseline.

The low-rank adapters are injected into the frozen backbone by
``peft.inject_adapter_in_model`` (nothing re-implemented here); the targets are
the backbone family's attention projections (``BackboneSpec.lora_target_modules``,
with ``fan_in_fan_out`` for GPT-2's Conv1D). PEFT moves each wrapped weight under
``base_layer`` but keeps the same tensor, and ``CLModel`` tracks the backbone's
own tensors by identity, so the saved adapter holds only the LoRA matrices and
the head. One set of adapters is trained across all tasks (no per-task adapters):
the usual "LoRA fine-tuning" lower-ish bound for parameter-efficient methods.
It is saved in PEFT's own format (see :meth:`LoraBaseline.peft_adapter`), so
``peft.PeftModel.from_pretrained(backbone, directory)`` loads the LoRA matrices.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from peft import LoraConfig, PeftConfig, inject_adapter_in_model

from hf_clroute.baselines.lora.config import LoraBaselineConfig
from hf_clroute.core.method import ContinualMethod, seeded_init

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


class LoraBaseline(ContinualMethod):
    """PEFT LoRA adapters in the backbone + the shared incremental head."""

    config_class = LoraBaselineConfig
    supported_modalities = ("image", "text", "lm")

    def attach(self, model: "CLModel") -> None:
        cfg, spec = self.config, model.spec
        peft_config = LoraConfig(
            r=cfg.r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.target_modules or spec.lora_target_modules),
            fan_in_fan_out=spec.lora_fan_in_fan_out,
            bias="none",
        )
        # LoRA's A matrices start random: seed them so a run does not depend on
        # whatever the global RNG holds when the model is built.
        with seeded_init(cfg.head_init_seed):
            inject_adapter_in_model(peft_config, model.backbone)
        self.peft_config = peft_config

    def peft_adapter(self, model: "CLModel") -> tuple[PeftConfig, dict[str, str]]:
        """The LoRA config, for the model PEFT users load from ``base_model_name_or_path``: a causal LM
        as ``CAUSAL_LM``, else the base model (``ViTModel``, ``BertModel``) with no task type. PEFT names a
        tensor by its path under ``base_model.model.`` without the adapter name, as its own
        ``get_peft_model_state_dict`` does (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
        config = copy.deepcopy(self.peft_config)
        config.task_type = "CAUSAL_LM" if model.spec.modality == "lm" else None
        config.target_modules = sorted(config.target_modules)  # PEFT holds a set: saved in a fixed order
        keys = {
            key: "base_model.model." + key.removeprefix("backbone.").replace(".default", "")
            for key in model.adapter_state_dict()
            if key.startswith("backbone.")
        }
        return config, keys
