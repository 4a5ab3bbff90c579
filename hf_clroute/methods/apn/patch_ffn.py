"""``PatchFFN``: a bank of routed low-rank "patches" that stands in for (or beside) an FFN.

For a token h (already the FFN's input), with x = LN(h) (no affine: routing and
the shared code see the same normalised token and no global scale parameter):

* routing: s_i = cos(x, p_i) / tau over K prototypes p_i; keep the top-k and
  softmax over the kept scores, w (sums to one per token);
* shared code: u = W_enc x + b_enc (rank r, shared by all patches);
* patch i: gate z_i = u * sigmoid(a_i * u + c_i) (patch-specific nonlinearity),
  decode Delta_i = D_i z_i with a patch-specific r x d decoder;
* output: gamma * sum_j w_j Delta_{i_j} (the caller adds it to the residual
  stream: the block's residual in "replace" mode, the frozen FFN in "adapter" mode).

Only the chosen patches are computed. The decoders live in one (K*r, d) table
and the weighted sum over the chosen patches is one ``embedding_bag`` call:
row i*r + c of the table is column c of D_i, and its per-sample weight is
w_j * z_{i_j}[c]. That gathers only the k*r rows a token uses (no K-fold dense
evaluation and no per-token copy of the decoders), and its backward writes
gradient only into those rows, so an unchosen patch gets exactly zero gradient
from the token.

The load-balancing term is Switch-Transformer style, shifted to be zero at
balance: K * sum_i f_i P_i - 1, f_i = fraction of the top-k assignments that
went to patch i (not differentiable), P_i = mean full-softmax routing
probability (differentiable). When usage is uniform (f_i = 1/K) it is exactly
sum_i P_i - 1 = 0 whatever P is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchFFN(nn.Module):
    """Routed low-rank patch bank: ``forward(h) -> gamma * sum_j w_j Delta_{i_j}(h)`` (same shape as h)."""

    def __init__(
        self,
        hidden_size: int,
        num_patches: int = 256,
        top_k: int = 4,
        rank: int = 32,
        tau: float = 0.07,
        gamma: float = 1.0,
        dropout: float = 0.0,
        zero_init: bool = False,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_patches:
            raise ValueError(f"PatchFFN: need 1 <= top_k <= num_patches, got top_k={top_k}, num_patches={num_patches}")
        self.hidden_size, self.num_patches, self.top_k, self.rank = hidden_size, num_patches, top_k, rank
        self.tau, self.gamma = tau, gamma
        self.prototypes = nn.Parameter(torch.randn(num_patches, hidden_size))
        self.encoder = nn.Linear(hidden_size, rank)
        self.gate_scale = nn.Parameter(torch.ones(num_patches, rank))
        self.gate_bias = nn.Parameter(torch.zeros(num_patches, rank))
        # (K*r, d): rows i*r .. i*r+r-1 are D_i transposed.
        self.decoders = nn.Parameter(torch.empty(num_patches * rank, hidden_size))
        # "adapter" mode starts at zero so attaching leaves a pretrained model's outputs unchanged.
        if zero_init:
            nn.init.zeros_(self.decoders)
        else:
            nn.init.normal_(self.decoders, std=rank**-0.5 / 4)
        self.dropout = nn.Dropout(dropout)
        #: set by every forward in training mode: the load-balance term and the top-k counts
        self.aux_loss: torch.Tensor | None = None
        self.step_counts: torch.Tensor | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, d) normalised tokens -> top-k indices (N, k), weights (N, k), all scores (N, K)."""
        scores = F.normalize(x, dim=-1) @ F.normalize(self.prototypes, dim=-1).T / self.tau
        top_scores, top_idx = scores.topk(self.top_k, dim=-1)
        return top_idx, top_scores.softmax(dim=-1), scores

    def load_balance_loss(self, top_idx: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        counts = torch.bincount(top_idx.flatten(), minlength=self.num_patches).to(scores.dtype)
        fraction = counts / counts.sum()
        mean_prob = scores.softmax(dim=-1).mean(dim=0)
        return self.num_patches * (fraction * mean_prob).sum() - 1.0

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = F.layer_norm(hidden_states.reshape(-1, shape[-1]), (shape[-1],))
        top_idx, weights, scores = self.route(x)
        code = self.encoder(x).unsqueeze(1)  # (N, 1, r), shared by the chosen patches
        gated = code * torch.sigmoid(self.gate_scale[top_idx] * code + self.gate_bias[top_idx])  # (N, k, r)
        rows = top_idx.unsqueeze(-1) * self.rank + torch.arange(self.rank, device=x.device)  # (N, k, r)
        per_row = (weights.unsqueeze(-1) * gated).flatten(1)  # (N, k*r)
        delta = F.embedding_bag(rows.flatten(1), self.decoders, per_sample_weights=per_row, mode="sum")
        if self.training:
            self.aux_loss = self.load_balance_loss(top_idx, scores)
            self.step_counts = torch.bincount(top_idx.flatten(), minlength=self.num_patches).detach()
        return (self.gamma * self.dropout(delta)).reshape(shape)

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one token's forward: routing, code, k gates, k decoders."""
        d, r, k, K = self.hidden_size, self.rank, self.top_k, self.num_patches
        return 2 * (K * d + d * r + k * r * d) + 4 * k * r

    def extra_repr(self) -> str:
        return f"hidden={self.hidden_size}, patches={self.num_patches}, top_k={self.top_k}, rank={self.rank}, tau={self.tau}, gamma={self.gamma}"


class AdapterFFN(nn.Module):
    """Pre-LN block FFN (ViT/GPT-2 ``mlp``): frozen FFN(h) + patches(h)."""

    def __init__(self, base: nn.Module, patches: PatchFFN) -> None:
        super().__init__()
        self.base, self.patches = base, patches

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.base(hidden_states) + self.patches(hidden_states)


class PostNormAdapterOutput(nn.Module):
    """BERT ``output(intermediate, x) = LN(dense(intermediate) + x)``: the patches' residual,
    computed from the FFN input x, joins the residual stream before the LayerNorm, i.e.
    LN(x + FFN(x) + patches(x)) - the routed residual beside the frozen FFN."""

    def __init__(self, base: nn.Module, patches: PatchFFN) -> None:
        super().__init__()
        self.base, self.patches = base, patches

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.base(hidden_states, input_tensor + self.patches(input_tensor))
