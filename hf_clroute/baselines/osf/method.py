"""OSF from PEFT itself, as a continual baseline: the preserved subspace grows from task to task.

PEFT's ``OSFConfig`` layer (``peft.tuners.osf``, injected by ``peft.inject_adapter_in_model``)
splits each target weight by its SVD: the top ``effective_rank`` singular directions stay fixed,
the rest (``U_low``, ``S_low``, ``V_low``) trains, each gradient projected off the fixed ones.
As PEFT's continual-learning example drives it, every task boundary consolidates the finished
task's update into the weight and decomposes that weight again with a larger preserved rank
(``OsfConfig.fraction_at``), so what earlier tasks wrote into the top directions stays.
``reproject`` also projects the trained vectors after each AdamW step (see its help).

The backbone's own tensors are never written. PEFT's layer subtracts the low part of the SVD it
computed itself from the weight under it, and ``PeftModel.from_pretrained`` recomputes that SVD
from the backbone it is given, before loading any tensor. So after a boundary the layer is
injected on the original weight ``W0`` (PEFT's SVD of ``W0`` at the new rank, as any loader
recomputes it), its trained vectors are set to the low part of the consolidated weight ``W``, its
fixed directions to the top ones of ``W`` (``_osf_U_high``/``_osf_V_high``, which PEFT's gradient
hook then uses), and its base layer holds ``B = W - low(W) + low(W0)``, a new frozen tensor: the
layer computes ``B + U S V - low(W0)``, exactly ``W`` at the boundary. The adapter is saved in
PEFT's format (:meth:`OsfBaseline.peft_adapter`): the trained vectors and, after a boundary,
``B`` under the base layer's key, which PEFT loads into the base model as it does saved biases
or embeddings. ``PeftModel.from_pretrained(backbone, directory)`` then computes what we do; the
fixed directions (used only to keep training) stay in our own file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from peft import OSFConfig, PeftConfig, inject_adapter_in_model
from peft.tuners.osf.layer import OSFLayer
from peft.tuners.osf.utils import decompose_weight_matrix
from torch import nn

from hf_clroute.baselines.osf.config import OsfConfig
from hf_clroute.core.method import ContinualMethod, StepContext

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

ADAPTER = "default"


class OsfBaseline(ContinualMethod):
    """PEFT OSF layers in the backbone, re-decomposed with a growing preserved rank at each task."""

    config_class = OsfConfig
    supported_modalities = ("image", "text")
    unsupported_hint = "(PEFT's OSF adapts nn.Linear layers; GPT-2's are Conv1D)"

    def __init__(self, config: OsfConfig) -> None:
        super().__init__(config)
        self.task = 0  # the task the current decomposition was made for
        self.fraction = config.fraction_at(0)
        self._host: list[nn.Module] = []  # the backbone (a list: not registered as a submodule)
        self._originals: dict[str, nn.Parameter] = {}  # target path -> the backbone's own weight W0

    # ---- structure -------------------------------------------------------------------
    def attach(self, model: "CLModel") -> None:
        cfg, spec = self.config, model.spec
        self.targets = list(cfg.target_modules or (*spec.attention_qkv, spec.attention_out, spec.ffn_in, spec.ffn_out))
        found = {name: module for name, module in model.backbone.named_modules()
                 if any(name == t or name.endswith("." + t) for t in self.targets)}
        if not found:
            raise ValueError(f"OsfConfig.target_modules {self.targets} match no module of this backbone")
        for name, module in found.items():
            if not isinstance(module, nn.Linear):
                raise ValueError(f"OsfConfig.target_modules: {name} is a {type(module).__name__}; PEFT's OSF "
                                 "adapts nn.Linear layers only")
            if int(min(module.weight.shape) * self.fraction) < 1:
                raise ValueError(f"OsfConfig.effective_rank {cfg.effective_rank} preserves no direction of {name} "
                                 f"(smaller dimension {min(module.weight.shape)}); raise it")
        self._host = [model.backbone]
        self._originals = {name: module.weight for name, module in found.items()}
        self._inject(self.fraction)

    def _inject(self, fraction: float) -> None:
        backbone = self._host[0]
        self.peft_config = OSFConfig(effective_rank=fraction, target_modules=list(self.targets))
        inject_adapter_in_model(self.peft_config, backbone)
        for layer in self.layers().values():
            # PEFT's S_low and V_low are slices of its SVD's outputs: each gets its own storage, else safetensors
            # (an Accelerate checkpoint) refuses a tensor that does not cover its storage
            for parameter in layer.osf_svd_params[ADAPTER].values():
                parameter.data = parameter.data.clone()

    def layers(self) -> dict[str, OSFLayer]:
        """Target path -> PEFT's OSF layer there."""
        return {name: m for name, m in self._host[0].named_modules() if isinstance(m, OSFLayer)}

    def _unwrap(self) -> None:
        """Each OSF layer replaced by its base layer, holding the backbone's own weight again."""
        backbone = self._host[0]
        for name, layer in self.layers().items():
            layer._detach_hooks()
            base = layer.get_base_layer()
            base.weight = self._originals[name]
            parent, _, child = name.rpartition(".")
            setattr(backbone.get_submodule(parent) if parent else backbone, child, base)
        if hasattr(backbone, "peft_config"):
            del backbone.peft_config  # else PEFT takes the next injection for a second adapter

    @torch.no_grad()
    def regrow(self, task: int, consolidated: dict[str, torch.Tensor] | None) -> None:
        """Decompose each target again for ``task`` at its preserved fraction: PEFT's layer on ``W0`` at the
        new rank, then set to the ``consolidated`` weight ``W`` (see the module docstring). ``None``: only
        the structure, with placeholders of the right shapes (a saved adapter's tensors load next)."""
        fraction = self.config.fraction_at(task)
        self._unwrap()
        self._inject(fraction)
        for name, layer in self.layers().items():
            base = layer.get_base_layer()
            weight = self._originals[name]
            k = layer.effective_rank[ADAPTER]
            if consolidated is None:
                high = {"U_high": weight.new_zeros(weight.shape[0], k), "V_high": weight.new_zeros(k, weight.shape[1])}
                new_base = torch.zeros_like(weight)
            else:
                W = consolidated[name]
                svd = decompose_weight_matrix(W, top_k=k)
                params = layer.osf_svd_params[ADAPTER]
                for part in ("U_low", "S_low", "V_low"):
                    params[part].copy_(svd[part])
                high = {part: svd[part].detach().clone() for part in ("U_high", "V_high")}
                new_base = (W.float() - low_product(svd["U_low"], svd["S_low"], svd["V_low"])
                            + low_product(*init_factors(layer))).to(weight.dtype)
            for part, buffers in (("U_high", layer._osf_U_high), ("V_high", layer._osf_V_high)):
                buffers[ADAPTER] = high[part].to(weight.device, weight.dtype)
                buffers._non_persistent_buffers_set.discard(ADAPTER)  # saved in our file: needed to keep training
            base.weight = nn.Parameter(new_base, requires_grad=False)
        self.task, self.fraction = task, fraction

    # ---- hooks -----------------------------------------------------------------------
    def on_task_start(self, model: "CLModel", experience: Any, ctx: StepContext) -> None:
        if ctx.task_id <= self.task:  # the first task, or a task resumed mid-way: already decomposed for it
            return
        with torch.no_grad():
            consolidated = {name: effective_weight(layer) for name, layer in self.layers().items()}
        self.regrow(ctx.task_id, consolidated)

    def after_step(self, model: "CLModel", batch: dict, out: Any, ctx: StepContext) -> None:
        if self.config.reproject:
            for layer in self.layers().values():
                project_to_complement(layer)

    # ---- saving ----------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"task": self.task, "fraction": self.fraction}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        task = int(state.get("task", 0))
        if task != self.task:
            self.regrow(task, None)

    def peft_adapter(self, model: "CLModel") -> tuple[PeftConfig, dict[str, str]]:
        """PEFT's OSF config at the current preserved fraction, for the base model (``ViTModel``, ``BertModel``),
        and PEFT's names of the trained vectors (``...q_proj.osf_svd_params.default.U_low`` ->
        ``...q_proj.osf_svd_params.U_low``) and, after a boundary, of each base layer's ``B``."""
        config = OSFConfig(effective_rank=self.fraction, target_modules=sorted(self.targets))
        ours = f".osf_svd_params.{ADAPTER}."
        keys = {
            key: "base_model.model." + key.removeprefix("backbone.").replace(ours, ".osf_svd_params.")
            for key in model.adapter_state_dict()
            if key.startswith("backbone.") and (".osf_svd_params." in key or key.endswith(".base_layer.weight"))
        }
        return config, keys


def init_factors(layer: OSFLayer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The low part PEFT's layer subtracts: the SVD it took of the weight under it when injected."""
    return layer._osf_U_low_init[ADAPTER], layer._osf_S_low_init[ADAPTER], layer._osf_V_low_init[ADAPTER]


def low_product(U: torch.Tensor, S: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return (U.float() * S.float().unsqueeze(0)) @ V.float()


def effective_weight(layer: OSFLayer) -> torch.Tensor:
    """The weight the layer applies now: its base layer's plus PEFT's delta (float32)."""
    return layer.get_base_layer().weight.float() + layer.get_delta_weight(ADAPTER).float()


@torch.no_grad()
def project_to_complement(layer: OSFLayer) -> None:
    """Project ``U_low``/``V_low`` off the preserved directions, as PEFT's gradient hook projects their gradients:
    with the stored top directions when the layer has them, else onto the span of its initial low part."""
    params = layer.osf_svd_params[ADAPTER]
    U, V = params["U_low"], params["V_low"]
    if ADAPTER in layer._osf_U_high:
        high = layer._osf_U_high[ADAPTER]
        U.sub_(high @ (high.T @ U))
    else:
        low = layer._osf_U_low_init[ADAPTER]
        U.copy_(low @ (low.T @ U))
    if ADAPTER in layer._osf_V_high:
        high = layer._osf_V_high[ADAPTER]
        V.sub_((V @ high.T) @ high)
    else:
        low = layer._osf_V_low_init[ADAPTER]
        V.copy_((V @ low.T) @ low)
