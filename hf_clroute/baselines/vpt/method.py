"""Visual prompt tuning (VPT-shallow, Jia et al. 2022) on a ViT: our own, since PEFT's
prompt tuning needs word embeddings and does not run on a ViT.

``num_prompts`` learned tokens are inserted into the token sequence right after
the patch embedding, i.e. after the CLS token has been prepended and the
position embeddings added: ``[CLS, P_1..P_m, patch_1..patch_N]``. The prompts
carry no position embedding (as in VPT) and pass through every frozen block;
the features remain the (final-LayerNorm'ed) CLS token, so the head and every
other method read the same kind of feature. Only the prompts and the head train.

The insertion is a forward hook on the backbone's ``embeddings`` module, so the
rest of the transformers forward runs unchanged.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from hf_clroute.baselines.vpt.config import VPTConfig
from hf_clroute.core.method import ContinualMethod

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


class VisualPromptTuning(ContinualMethod):
    config_class = VPTConfig
    supported_modalities = ("image",)

    def attach(self, model: "CLModel") -> None:
        if model.spec.model_type != "vit":
            raise ValueError(f"vpt needs a ViT backbone, not {model.spec.model_type!r} (for BERT use 'prompt-tuning')")
        config = model.backbone.config
        hidden, patch = config.hidden_size, config.patch_size
        # VPT's init: uniform with the Xavier bound of a (patch*patch*channels -> hidden) projection.
        bound = math.sqrt(6.0 / float(config.num_channels * patch * patch + hidden))
        generator = torch.Generator().manual_seed(self.config.head_init_seed)
        prompts = (torch.rand(self.config.num_prompts, hidden, generator=generator) * 2 - 1) * bound
        self.prompts = nn.Parameter(prompts)
        model.backbone.embeddings.register_forward_hook(self._insert_prompts)

    def _insert_prompts(self, module: nn.Module, args: tuple, embeddings: torch.Tensor) -> torch.Tensor:
        prompts = self.prompts.to(embeddings.dtype).unsqueeze(0).expand(embeddings.shape[0], -1, -1)
        return torch.cat([embeddings[:, :1], prompts, embeddings[:, 1:]], dim=1)
