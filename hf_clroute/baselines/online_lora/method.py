"""Online-LoRA: one LoRA at a time, merged into the weights whenever the loss plateaus.

Task-free: no hook here reads a task boundary. After every step the loss (averaged over
processes) joins a window; a plateau is a window whose mean and variance are both below
their bounds, after a peak since the last plateau. At a plateau:

1. the importance of every merged weight is estimated on the hard-example buffer (the
   samples of highest loss since the last plateau): each sample's squared gradient of the
   cross-entropy with respect to the weights, averaged, added to Omega;
2. the LoRA merges into the weights (``MergeableLoRA.merged``) and a new one starts.

Training adds ``penalty_weight * sum Omega * (s B A)^2``: the new LoRA may move the weights
that mattered at earlier plateaus only at a cost. Every process keeps the same buffer (each
step's samples and losses are gathered), so the processes estimate the same importance.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hf_clroute.baselines.online_lora.config import OnlineLoraConfig
from hf_clroute.baselines.online_lora.layer import MergeableLoRA
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class OnlineLora(ContinualMethod):
    config_class = OnlineLoraConfig
    supported_modalities = ("image", "text")

    def __init__(self, config: OnlineLoraConfig) -> None:
        super().__init__(config)
        self.consolidations = 0
        self.losses: list[float] = []  # the loss window
        self.peak = True  # a peak since the last plateau (the first plateau needs none)
        self.last_plateau = (0.0, 0.0)  # (mean, variance) of the last plateau's window
        self.hard: list[tuple[float, dict[str, torch.Tensor]]] = []  # (loss, one sample), highest loss first

    def attach(self, model: "CLModel") -> None:
        cfg = self.config
        targets = set(cfg.target_modules or model.spec.lora_target_modules)
        found = [(name, module) for name, module in model.backbone.named_modules()
                 if name.rpartition(".")[2] in targets and isinstance(module, torch.nn.Linear)]
        if not found:
            raise ValueError(f"OnlineLoraConfig.target_modules {sorted(targets)} match no linear layer of this "
                             "backbone")
        self.adapted = torch.nn.ModuleList()
        generator = torch.Generator().manual_seed(cfg.init_seed)
        for name, module in found:
            parent_path, _, attr = name.rpartition(".")
            layer = MergeableLoRA(module, cfg.r, cfg.lora_alpha / cfg.r)
            layer.restart(generator)
            setattr(model.backbone.get_submodule(parent_path) if parent_path else model.backbone, attr, layer)
            self.adapted.append(layer)

    def extra_losses(self, model: "CLModel", batch: dict, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        if not self.consolidations or not self.config.penalty_weight:
            return {}
        return {"importance": self.config.penalty_weight * sum(layer.penalty() for layer in self.adapted)}

    # ---- after every step: the hard buffer and the plateau test -------------------------
    def after_step(self, model: "CLModel", batch: dict, out: Any, ctx: StepContext) -> None:
        if out.losses is None:
            return
        self._update_hard_buffer(batch, out.logits.detach(), ctx)
        loss = float(ctx.reduce(out.losses["ce"].detach().float()) / ctx.num_processes)
        if self.at_plateau(loss):
            self.consolidate(model)

    def at_plateau(self, loss: float) -> bool:
        """Add a step's loss to the window; True when the window is a plateau after a peak."""
        cfg = self.config
        self.losses = (self.losses + [loss])[-cfg.window:]
        if len(self.losses) < cfg.window:
            return False
        mean = sum(self.losses) / len(self.losses)
        variance = sum((x - mean) ** 2 for x in self.losses) / len(self.losses)
        last_mean, last_variance = self.last_plateau
        if not self.peak and mean > last_mean + math.sqrt(last_variance):
            self.peak = True
        if self.peak and mean < cfg.plateau_mean and variance < cfg.plateau_variance:
            self.peak, self.last_plateau = False, (mean, variance)
            return True
        return False

    def _update_hard_buffer(self, batch: dict, logits: torch.Tensor, ctx: StepContext) -> None:
        labels = batch["labels"]
        losses = F.cross_entropy(logits.float(), labels, reduction="none")
        samples = {k: v for k, v in model_inputs(batch).items() if k != "features"}
        gathered = {k: _gather_padded(v, ctx) if k in _TOKEN_INPUTS else ctx.gather(v) for k, v in samples.items()}
        gathered["labels"], losses = ctx.gather(labels), ctx.gather(losses)
        rows = [(float(losses[i]), _trimmed({k: v[i:i + 1].cpu() for k, v in gathered.items()}))
                for i in range(len(losses))]
        self.hard = sorted(self.hard + rows, key=lambda row: -row[0])[: self.config.hard_buffer_size]

    # ---- consolidation ------------------------------------------------------------------
    def consolidate(self, model: "CLModel") -> None:
        """Importance from the hard buffer, then merge the LoRA and start a new one."""
        self.estimate_importance(model)
        generator = torch.Generator().manual_seed(self.config.init_seed * 1_000_003 + self.consolidations + 1)
        for layer in self.adapted:
            layer.merge()
            layer.restart(generator)
        self.consolidations += 1
        self.hard = []

    def estimate_importance(self, model: "CLModel") -> None:
        if not self.hard:
            return
        merged = [layer.merged for layer in self.adapted]
        squares = [torch.zeros_like(m) for m in merged]
        was_training = model.training
        model.eval()  # the weights as they predict: no dropout in the estimate
        device = merged[0].device
        try:
            for tensor in merged:
                tensor.requires_grad_(True)  # dL/dM = dL/dW: the merged weights' gradient
            for _, sample in self.hard:
                sample = {k: v.to(device) for k, v in sample.items()}
                loss = F.cross_entropy(model(**model_inputs(sample)).logits, sample["labels"])
                # autograd.grad leaves .grad alone, and DDP's hooks out of this.
                for square, grad in zip(squares, torch.autograd.grad(loss, merged)):
                    square += grad.detach().pow(2)
        finally:
            for tensor in merged:
                tensor.requires_grad_(False)
            model.train(was_training)
        for layer, square in zip(self.adapted, squares):
            layer.importance += square / len(self.hard)

    def extra_state(self) -> dict[str, Any]:
        return {"consolidations": self.consolidations, "losses": self.losses, "peak": self.peak,
                "last_plateau": list(self.last_plateau)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.consolidations = int(state.get("consolidations", 0))
        self.losses = [float(x) for x in state.get("losses", [])]
        self.peak = bool(state.get("peak", True))
        self.last_plateau = tuple(float(x) for x in state.get("last_plateau", (0.0, 0.0)))


def _gather_padded(tensor: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    """Gather (B, L) token tensors whose L differs between processes: right-padded with 0 (padding,
    masked out) to the sum of the processes' lengths, a bound on the longest that one reduce gives."""
    if ctx.num_processes == 1:
        return tensor
    total = int(ctx.reduce(torch.tensor(float(tensor.shape[1]), device=tensor.device)))
    return ctx.gather(F.pad(tensor, (0, total - tensor.shape[1])))


def _trimmed(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One sample without the padding columns after its last real token."""
    mask = sample.get("attention_mask")
    if mask is None or not bool(mask.any()):
        return sample
    end = int(mask[0].nonzero().max()) + 1
    return {k: v[:, :end] if k in _TOKEN_INPUTS else v for k, v in sample.items()}
