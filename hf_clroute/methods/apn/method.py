"""APN as a continual method: patch banks in (or beside) the FFN of chosen blocks.

``mode="replace"`` swaps a pre-LN block's FFN module (GPT-2/ViT ``mlp``) for a
:class:`PatchFFN`; the block still adds the residual, so the block computes
h + gamma * sum_j w_j Delta_j. ``mode="adapter"`` keeps the frozen FFN and adds
the patch residual beside it: ``mlp(h) + patches(h)`` for pre-LN blocks, and for
post-LN BERT the patch residual of the FFN input joins the residual inside
``output`` before its LayerNorm (see :class:`PostNormAdapterOutput`).

``freeze_routing_after_first_task`` stops the prototypes and code encoder(s) from
training after the first task (``on_task_start``, undone at each task's end, so the
saved adapter holds them as trained weights and a resumed run re-freezes them).

The method also keeps, per task, how often each patch of each bank was chosen
during training (``patch_usage``, saved with the adapter), which
:func:`patch_overlap` turns into the overlap between domains.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.core.method import (
    ContinualMethod,
    StepContext,
    freeze_all_but,
    unfreeze,
)
from hf_clroute.methods.apn.config import ApnConfig
from hf_clroute.methods.apn.patch_ffn import AdapterFFN, PatchFFN, PostNormAdapterOutput

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel
    from hf_clroute.data.experiences import Experience


def resolve_blocks(target_blocks: list[int] | None, num_blocks: int) -> list[int]:
    if target_blocks is None:
        return list(range(num_blocks))
    bad = [i for i in target_blocks if not -num_blocks <= i < num_blocks]
    if bad:
        raise ValueError(f"ApnConfig.target_blocks {bad} out of range for a model with {num_blocks} blocks")
    return sorted({i % num_blocks for i in target_blocks})


class Apn(ContinualMethod):
    config_class = ApnConfig
    supported_modalities = ("image", "text", "lm")

    def __init__(self, config: ApnConfig) -> None:
        super().__init__(config)
        # (tasks, banks, K) top-k assignment counts while training each task; float64 so
        # sums stay exact across processes.
        self.register_buffer("patch_usage", torch.zeros(0, 0, config.num_patches, dtype=torch.float64))
        # The banks are owned by the backbone (their parameters are saved under its
        # module paths); a plain list here, so they are not registered twice.
        self.banks: list[PatchFFN] = []
        self._pending: torch.Tensor | None = None
        self._task = 0
        self._frozen: list[nn.Parameter] = []

    # ---- structure -----------------------------------------------------------------
    def attach(self, model: "CLModel") -> None:
        cfg, spec = self.config, model.spec
        blocks = get_blocks(model.backbone)
        if cfg.mode == "replace" and (spec.post_norm or len(spec.ffn) != 1):
            raise ValueError(
                f"ApnConfig.mode='replace' needs a pre-LN block with one FFN module (gpt2, vit); "
                f"{spec.model_type!r} is post-LN: use mode='adapter'"
            )
        hidden = spec.hidden_size(model.backbone)
        for index in resolve_blocks(cfg.target_blocks, len(blocks)):
            block = blocks[index]
            bank = PatchFFN(
                hidden, cfg.num_patches, cfg.top_k, cfg.rank, cfg.tau, cfg.gamma, cfg.dropout,
                zero_init=cfg.mode == "adapter", code_encoder=cfg.code_encoder,
                balance_horizon=cfg.load_balance_horizon,
            ).to(dtype=next(block.parameters()).dtype)
            path = spec.ffn[-1] if spec.post_norm else spec.ffn[0]
            if cfg.mode == "replace":
                block.set_submodule(path, bank)
            elif spec.post_norm:
                block.set_submodule(path, PostNormAdapterOutput(block.get_submodule(path), bank))
            else:
                block.set_submodule(path, AdapterFFN(block.get_submodule(path), bank))
            self.banks.append(bank)
        self.patch_usage = torch.zeros(0, len(self.banks), cfg.num_patches, dtype=torch.float64)

    # ---- training ----------------------------------------------------------------
    def extra_losses(self, model: "CLModel", batch, logits) -> dict[str, torch.Tensor]:
        terms = [bank.aux_loss for bank in self.banks if bank.aux_loss is not None]
        for bank in self.banks:
            bank.aux_loss = None  # used once: do not keep this step's graph alive
        if not self.config.load_balance_weight or not terms:
            return {}
        return {"load_balance": self.config.load_balance_weight * torch.stack(terms).mean()}

    def on_task_start(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        self._task = ctx.task_id
        if self.patch_usage.shape[0] <= ctx.task_id:
            self._resize_usage(ctx.task_id + 1)
        if self.config.adapt_params == "ffn" and ctx.task_id > 0:
            self._frozen = freeze_all_but(model, [*self.banks, model.head])
        if self.config.freeze_routing_after_first_task and ctx.task_id > 0:
            # Decided from the task id and the saved config alone, so a resumed run freezes the same.
            routing = [p for bank in self.banks for p in bank.routing_parameters() if p.requires_grad]
            for param in routing:
                param.requires_grad_(False)
            self._frozen += routing

    def after_step(self, model: "CLModel", batch, out, ctx: StepContext) -> None:
        counts = [bank.step_counts for bank in self.banks]
        if any(c is None for c in counts):
            return
        step = torch.stack(counts).to(torch.float64)
        self._pending = step if self._pending is None else self._pending + step
        for bank in self.banks:
            bank.step_counts = None

    def before_evaluation(self, model: "CLModel", ctx: StepContext) -> None:
        # Every process counted its own shard; sum them (a collective: all processes call this).
        pending = self._pending if self._pending is not None else self.patch_usage.new_zeros(self.patch_usage.shape[1:])
        pending = ctx.reduce(pending)
        if self.patch_usage.shape[0] > self._task:
            self.patch_usage[self._task] += pending.to(self.patch_usage.device)
        self._pending = None

    def on_task_end(self, model: "CLModel", experience: "Experience", ctx: StepContext) -> None:
        self.before_evaluation(model, ctx)
        unfreeze(self._frozen)
        self._frozen = []

    # ---- state ---------------------------------------------------------------------
    def _resize_usage(self, tasks: int) -> None:
        usage = self.patch_usage.new_zeros(tasks, len(self.banks), self.config.num_patches)
        keep = min(tasks, self.patch_usage.shape[0])
        usage[:keep] = self.patch_usage[:keep]
        self.patch_usage = usage

    def extra_state(self) -> dict[str, Any]:
        return {"usage_tasks": int(self.patch_usage.shape[0])}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._resize_usage(int(state.get("usage_tasks", 0)))


# ------------------------------------------------------------------ patch overlap between tasks
def covering_set(counts: torch.Tensor, coverage: float) -> set[int]:
    """The most-used patches that together hold ``coverage`` of the assignments."""
    order = counts.argsort(descending=True)
    cumulative = counts[order].cumsum(0) / counts.sum().clamp_min(1)
    needed = int((cumulative < coverage).sum()) + 1
    return set(order[:needed].tolist())


def patch_overlap(usage: torch.Tensor, coverage: float = 0.8) -> dict[str, list[list[float]]]:
    """Overlap of the patches tasks use, from ``Apn.patch_usage`` (tasks, banks, K).

    ``jaccard[s][t]``: Jaccard index of the covering sets (most-used patches holding
    ``coverage`` of the assignments) of tasks s and t, averaged over banks.
    ``weighted_jaccard[s][t]``: sum_i min(p_i, q_i) / sum_i max(p_i, q_i) of the two usage
    distributions, averaged over banks (1 = same usage, 0 = disjoint patches).
    """
    tasks, banks = usage.shape[0], usage.shape[1]
    dist = usage / usage.sum(dim=-1, keepdim=True).clamp_min(1)
    jac = [[0.0] * tasks for _ in range(tasks)]
    wjac = [[0.0] * tasks for _ in range(tasks)]
    for s in range(tasks):
        for t in range(tasks):
            sets = [(covering_set(usage[s, b], coverage), covering_set(usage[t, b], coverage)) for b in range(banks)]
            jac[s][t] = sum(len(a & c) / len(a | c) for a, c in sets) / max(banks, 1)
            ratio = torch.minimum(dist[s], dist[t]).sum(-1) / torch.maximum(dist[s], dist[t]).sum(-1).clamp_min(1e-12)
            wjac[s][t] = float(ratio.mean()) if banks else 0.0
    return {"jaccard": jac, "weighted_jaccard": wjac}


def usage_per_domain(usage: torch.Tensor, coverage: float = 0.8) -> list[dict[str, float]]:
    """How each task (domain) used the patches, from ``Apn.patch_usage`` (tasks, banks, K); per task,
    averaged over banks:

    ``assignments``: top-k assignments counted while training it (summed over banks);
    ``patches_covering``: how many patches hold ``coverage`` of them (K = spread over every patch);
    ``usage_entropy``: entropy of its usage distribution over log K (1 = uniform over all patches);
    ``share_in_first_cover``: the share of its assignments that land in the first task's covering set
    (for the first task itself, about ``coverage``); a local update keeps this low for later tasks.
    """
    tasks, banks, K = usage.shape
    out = []
    for t in range(tasks):
        dist = usage[t] / usage[t].sum(-1, keepdim=True).clamp_min(1)
        entropy = -(dist * dist.clamp_min(1e-300).log()).sum(-1) / max(math.log(K), 1e-12)
        covering = [covering_set(usage[t, b], coverage) for b in range(banks)]
        first = [sorted(covering_set(usage[0, b], coverage)) for b in range(banks)]
        in_first = [float(dist[b, first[b]].sum()) for b in range(banks)]
        out.append({
            "assignments": float(usage[t].sum()),
            "patches_covering": sum(len(c) for c in covering) / max(banks, 1),
            "usage_entropy": float(entropy.mean()) if banks else 0.0,
            "share_in_first_cover": sum(in_first) / max(banks, 1),
        })
    return out
