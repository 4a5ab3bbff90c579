"""Online-LoRA: one LoRA at a time, merged into the weights whenever the loss plateaus.

Task-free: no hook here reads a task boundary. Every training step replays the hard buffer
(the samples of highest loss) with the batch: the loss is the batch's cross-entropy plus each
buffer sample's (``hard``), plus the penalty. After the step the summed cross-entropy (averaged
over processes) joins a window; a plateau is a window whose mean and variance are both below
their bounds, after a peak since the last plateau (or before the first). The buffer then keeps
the highest-loss samples among itself and the batch, by this step's losses; at a plateau it
starts empty instead (ours: the authors' release keeps the step's highest-loss samples).
At a plateau:

1. the importance of the current LoRA's A and B is estimated on the hard buffer: each
   sample's squared gradient of the cross-entropy against its predicted label, summed, and
   averaged with the earlier plateaus' (a running mean, weight 1/n for the n-th);
2. the LoRA merges into the weights (``MergeableLoRA.merged``) and a new one starts.

Training adds ``penalty_weight / 2 * sum Omega_A A^2 + Omega_B B^2`` on the new LoRA. Every
process keeps the same buffer (each step's samples and losses are gathered).
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
        self._replayed: list[tuple[float, dict[str, torch.Tensor]]] = []  # the buffer with this step's losses

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
        losses = {}
        self._replayed = []
        if self.hard and model.training:
            losses["hard"] = self.replay(model, logits.device)
        if self.consolidations and self.config.penalty_weight:
            penalty = sum(layer.penalty() for layer in self.adapted)
            losses["importance"] = self.config.penalty_weight / 2 * penalty
        return losses

    def replay(self, model: "CLModel", device: torch.device) -> torch.Tensor:
        """The hard buffer through the model, inside this step's model call: the sum of its samples'
        cross-entropies. Their fresh losses are kept for the buffer's update after the step."""
        samples = [sample for _, sample in self.hard]
        stacked = {k: v.to(device) for k, v in _stacked(samples).items()}
        inputs = model_inputs(stacked)
        logits = self.classify(model, self.features(model, inputs))
        per_sample = F.cross_entropy(logits.float(), stacked["labels"], reduction="none")
        self._replayed = [(float(loss), sample) for loss, sample in zip(per_sample.detach().cpu(), samples)]
        return per_sample.sum()

    # ---- after every step: the plateau test and the hard buffer -------------------------
    def after_step(self, model: "CLModel", batch: dict, out: Any, ctx: StepContext) -> None:
        if out.losses is None:
            return
        summed = out.losses["ce"].detach().float() + out.losses.get("hard", torch.zeros(())).detach().float().to(
            out.losses["ce"].device)
        loss = float(ctx.reduce(summed) / ctx.num_processes)
        if self.at_plateau(loss):
            self.consolidate(model)  # on the buffer this step replayed; the next buffer starts empty (ours)
        else:
            self._update_hard_buffer(batch, out.logits.detach(), ctx)
        self._replayed = []

    def at_plateau(self, loss: float) -> bool:
        """Add a step's summed loss to the window; True when the window is a plateau after a peak."""
        cfg = self.config
        self.losses = (self.losses + [loss])[-cfg.window:]
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
        """The highest-loss samples among the batch and the buffer, by this step's losses (the buffer's
        as replayed; without a replay, e.g. outside training, their last ones)."""
        labels = batch["labels"]
        losses = F.cross_entropy(logits.float(), labels, reduction="none")
        samples = {k: v for k, v in model_inputs(batch).items() if k != "features"}
        gathered = {k: _gather_padded(v, ctx) if k in _TOKEN_INPUTS else ctx.gather(v) for k, v in samples.items()}
        gathered["labels"], losses = ctx.gather(labels), ctx.gather(losses)
        rows = [(float(losses[i]), _trimmed({k: v[i:i + 1].cpu() for k, v in gathered.items()}))
                for i in range(len(losses))]
        buffered = self._replayed if len(self._replayed) == len(self.hard) else self.hard
        self.hard = sorted(buffered + rows, key=lambda row: -row[0])[: self.config.hard_buffer_size]

    # ---- consolidation ------------------------------------------------------------------
    def consolidate(self, model: "CLModel") -> None:
        """Importance of the LoRA matrices from the hard buffer, then merge the LoRA and start a new one."""
        self.consolidations += 1
        self.estimate_importance(model)
        generator = torch.Generator().manual_seed(self.config.init_seed * 1_000_003 + self.consolidations)
        for layer in self.adapted:
            layer.merge()
            layer.restart(generator)
        self.hard = []

    def estimate_importance(self, model: "CLModel") -> None:
        """Omega <- g / n + (1 - 1/n) Omega at the n-th plateau; g: the squared gradients of A and B of the
        cross-entropy against each buffer sample's predicted label, summed over the buffer."""
        matrices = [m for layer in self.adapted for m in (layer.lora_A, layer.lora_B)]
        squares = [torch.zeros_like(m) for m in matrices]
        was_training = model.training
        model.eval()  # the weights as they predict: no dropout in the estimate
        device = matrices[0].device
        try:
            for _, sample in self.hard:
                sample = {k: v.to(device) for k, v in sample.items()}
                logits = model(**model_inputs(sample)).logits
                predicted = logits.argmax(dim=-1).detach()  # the model's own label, not the true one
                loss = F.cross_entropy(logits.float(), predicted)
                # autograd.grad leaves .grad alone, and DDP's hooks out of this.
                for square, grad in zip(squares, torch.autograd.grad(loss, matrices, allow_unused=True)):
                    if grad is not None:
                        square += grad.detach().pow(2)
        finally:
            model.train(was_training)
        n = self.consolidations
        with torch.no_grad():
            for i, layer in enumerate(self.adapted):
                for omega, square in ((layer.importance_A, squares[2 * i]), (layer.importance_B, squares[2 * i + 1])):
                    omega.mul_(1 - 1 / n).add_(square / n)

    def run_records(self) -> dict[str, Any]:
        """What a run reports of this method per seed: how many times the LoRA was consolidated."""
        return {"consolidations": self.consolidations}

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


def _stacked(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One batch of buffered samples; token tensors right-padded with 0 (padding, masked out)."""
    width = max((s["input_ids"].shape[1] for s in samples if "input_ids" in s), default=0)
    return {k: torch.cat([F.pad(s[k], (0, width - s[k].shape[1])) if k in _TOKEN_INPUTS else s[k]
                          for s in samples]) for k in samples[0]}


def _trimmed(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One sample without the padding columns after its last real token."""
    mask = sample.get("attention_mask")
    if mask is None or not bool(mask.any()):
        return sample
    end = int(mask[0].nonzero().max()) + 1
    return {k: v[:, :end] if k in _TOKEN_INPUTS else v for k, v in sample.items()}
