"""PEFT's prompt tuning on a BERT backbone, as a continual baseline.

``peft.get_peft_model(bert, PromptTuningConfig(task_type="FEATURE_EXTRACTION"))``
prepends ``num_virtual_tokens`` learned embeddings to the word embeddings of every
input (and ones to the attention mask); the backbone stays frozen and one prompt
is trained across all tasks, with the shared incremental head.

Pooling: the backbone's mean pooling is taken over the *real* tokens only; the
virtual tokens act through attention but are not averaged in. That keeps the
features on the scale MiniLM was trained to produce and identical in definition
to every other method's features. PEFT itself drops ``token_type_ids`` under
prompt tuning (all zeros for single sentences, so nothing is lost here), and the
real tokens' absolute positions shift by ``num_virtual_tokens``.

PEFT's prompt tuning needs word embeddings, so it cannot run on a ViT:
use the ``vpt`` baseline (visual prompt tuning) there.

It is saved in PEFT's own format (see :meth:`PromptTuningBaseline.peft_adapter`), so
``peft.PeftModel.from_pretrained(bert, directory)`` loads the prompt.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from peft import PeftConfig, PromptTuningConfig, get_peft_model

from hf_clroute.backbones.catalog import pooled_features
from hf_clroute.baselines.prompt_tuning.config import PromptTuningBaselineConfig
from hf_clroute.core.method import ContinualMethod, seeded_init

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


class PromptTuningBaseline(ContinualMethod):
    config_class = PromptTuningBaselineConfig
    unsupported_hint = "(PEFT's prompt tuning needs word embeddings; on ViT use 'vpt', visual prompt tuning)"
    supported_modalities = ("text",)

    def attach(self, model: "CLModel") -> None:
        if model.spec.model_type != "bert":
            raise ValueError(
                f"prompt-tuning (PEFT) needs a BERT backbone, not {model.spec.model_type!r}; "
                "for a ViT use the 'vpt' baseline (visual prompt tuning)"
            )
        cfg = self.config
        peft_config = PromptTuningConfig(
            task_type="FEATURE_EXTRACTION",
            num_virtual_tokens=cfg.num_virtual_tokens,
            prompt_tuning_init=cfg.prompt_tuning_init,
        )
        with seeded_init(cfg.head_init_seed):
            peft_model = get_peft_model(model.backbone, peft_config)
        # The PeftModel wraps the very backbone CLModel already holds: keep it out of
        # the module tree (else every backbone tensor would appear twice) and register
        # only its prompt encoder, the one thing it adds.
        self.__dict__["_peft_model"] = peft_model
        self.prompt_encoder = peft_model.prompt_encoder

    def peft_adapter(self, model: "CLModel") -> tuple[PeftConfig, dict[str, str]]:
        """PEFT's config as ``get_peft_model`` completed it (layers, width, heads of the backbone); PEFT
        saves a prompt-tuning adapter as one tensor, ``prompt_embeddings``: the prompt encoder's table."""
        table = "method.prompt_encoder.default.embedding.weight"
        return self._peft_model.peft_config["default"], {table: "prompt_embeddings"}

    def features(self, model: "CLModel", inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if "features" in inputs:
            return inputs["features"]
        mask = inputs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(inputs["input_ids"])
        outputs = self._peft_model(input_ids=inputs["input_ids"], attention_mask=mask)
        real_tokens = outputs.last_hidden_state[:, self.config.num_virtual_tokens :]
        return pooled_features(model.spec, SimpleNamespace(last_hidden_state=real_tokens), mask)

