"""``PatchFFN``: a bank of routed low-rank "patches" that stands in for (or beside) an FFN.

For a token h (already the FFN's input), with x = LN(h) (no affine: routing and
the shared code see the same normalised token and no global scale parameter):

* routing: s_i = cos(x, p_i) / tau over K prototypes p_i; keep the top-k and
  softmax over the kept scores, w (sums to one per token);
* code: u = W_enc x + b_enc (rank r), shared by all patches (``code_encoder="shared"``,
  the paper's), or u_i = W_i x + b_i with one encoder per patch (``"per_patch"``, see
  :class:`PatchEncoders`: each patch's code is its own, so a patch's encoder learns only
  from the tokens routed to it);
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

A Switch-Transformer-style load-balancing term, zero at balance, spreads the tokens over the
patches (:meth:`PatchFFN.load_balance_loss`).

In eval mode the modules here change no state (the usage statistics move only in train mode), so once
frozen they are fixed functions of their input (``FixedInEval``): the engine may keep their features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.backbones.catalog import FixedInEval
from hf_clroute.methods.apn.config import CODE_ENCODERS


class PatchEncoders(FixedInEval, nn.Module):
    """One rank-r code encoder per patch, ``forward(x, top_idx) -> (N, k, r)``: u_{n,j} = W_{i_j} x_n + b_{i_j}.

    Only the chosen (token, patch) pairs are computed: the pairs are sorted by patch and
    packed into blocks of ``block`` rows, each block holding one patch's pairs (zero padding
    at the end of each patch's last block), and one batched matmul of the (blocks, block, d)
    inputs against each block's patch encoder gives the codes. The work is about
    (N*k + K*block) * d * r whatever the routing skew (a patch taking most tokens costs no
    padding elsewhere). A patch's encoder gets gradient only from the tokens routed to it
    (the padding rows are zero). Each encoder is initialised like ``nn.Linear(d, r)``.
    """

    block = 64

    def __init__(self, hidden_size: int, num_patches: int, rank: int) -> None:
        super().__init__()
        self.hidden_size, self.num_patches, self.rank = hidden_size, num_patches, rank
        bound = hidden_size**-0.5
        # (K*r, d): rows i*r .. i*r+r-1 are patch i's encoder.
        self.weight = nn.Parameter(torch.empty(num_patches * rank, hidden_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num_patches * rank).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
        K, r, d, B = self.num_patches, self.rank, self.hidden_size, self.block
        n, k = top_idx.shape
        flat = top_idx.flatten()
        counts = torch.bincount(flat, minlength=K)
        blocks_per_patch = (counts + B - 1) // B
        blocks = int(blocks_per_patch.sum())
        first_block = blocks_per_patch.cumsum(0) - blocks_per_patch
        order = flat.argsort(stable=True)  # pairs grouped by patch
        patch = flat[order]
        rank_in_patch = torch.arange(n * k, device=x.device) - (counts.cumsum(0) - counts)[patch]
        row = torch.empty_like(flat)  # each pair's row in the packed blocks, in the pairs' own order
        row[order] = (first_block[patch] + rank_in_patch // B) * B + rank_in_patch % B
        packed = x.new_zeros(blocks * B, d).index_copy(0, row, x.repeat_interleave(k, dim=0))
        block_patch = torch.repeat_interleave(torch.arange(K, device=x.device), blocks_per_patch, output_size=blocks)
        weight = self.weight.view(K, r, d).index_select(0, block_patch)  # (blocks, r, d)
        bias = self.bias.view(K, r).index_select(0, block_patch).unsqueeze(1)  # (blocks, 1, r)
        codes = torch.baddbmm(bias, packed.view(blocks, B, d), weight.transpose(1, 2))  # (blocks, B, r)
        return codes.reshape(blocks * B, r).index_select(0, row).view(n, k, r)

    def extra_repr(self) -> str:
        return f"patches={self.num_patches}, hidden={self.hidden_size}, rank={self.rank}"


class PatchFFN(FixedInEval, nn.Module):
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
        code_encoder: str = "shared",
        balance_horizon: int = 1,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_patches:
            raise ValueError(f"PatchFFN: need 1 <= top_k <= num_patches, got top_k={top_k}, num_patches={num_patches}")
        if code_encoder not in CODE_ENCODERS:
            raise ValueError(f"PatchFFN: code_encoder must be one of {CODE_ENCODERS}, got {code_encoder!r}")
        if not isinstance(balance_horizon, int) or balance_horizon < 1:
            raise ValueError(f"PatchFFN: balance_horizon must be an integer >= 1, got {balance_horizon!r}")
        self.hidden_size, self.num_patches, self.top_k, self.rank = hidden_size, num_patches, top_k, rank
        self.tau, self.gamma = tau, gamma
        self.code_encoder, self.balance_horizon = code_encoder, balance_horizon
        self.prototypes = nn.Parameter(torch.randn(num_patches, hidden_size))
        self.encoder: nn.Module = (
            nn.Linear(hidden_size, rank) if code_encoder == "shared" else PatchEncoders(hidden_size, num_patches, rank)
        )
        if balance_horizon > 1:  # only then: an adapter saved without them keeps loading
            self.register_buffer("usage_ema", torch.zeros(num_patches))
            self.register_buffer("usage_ema_steps", torch.zeros((), dtype=torch.long))
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

    def routing_parameters(self) -> list[nn.Parameter]:
        """What decides and encodes a token's patches: the prototypes and the code encoder(s)."""
        return [self.prototypes, *self.encoder.parameters()]

    def balance_usage(self, fraction: torch.Tensor) -> torch.Tensor:
        """The usage f the balance term weighs: this batch's fraction (horizon 1), or, after
        folding it into the running average, the bias-corrected EMA over ~``balance_horizon`` steps."""
        if self.balance_horizon == 1:
            return fraction
        decay = 1.0 - 1.0 / self.balance_horizon
        with torch.no_grad():
            self.usage_ema.mul_(decay).add_(fraction.to(self.usage_ema.dtype), alpha=1.0 - decay)
            self.usage_ema_steps += 1
            corrected = self.usage_ema / (1.0 - decay ** int(self.usage_ema_steps))
        return corrected.to(fraction.dtype)

    def load_balance_loss(self, top_idx: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The load-balancing term, Switch-Transformer style, shifted to be zero at balance.

        K * sum_i f_i P_i - 1, f_i = fraction of the top-k assignments that went to patch i
        (not differentiable), P_i = mean full-softmax routing probability (differentiable).
        When usage is uniform (f_i = 1/K) it is exactly sum_i P_i - 1 = 0 whatever P is. With
        ``balance_horizon`` N > 1, f is instead a bias-corrected exponential moving average
        (decay 1 - 1/N) of the batches' assignment fractions, kept across steps and tasks
        (buffers ``usage_ema``, ``usage_ema_steps``): balance is then asked of the usage over the
        last ~N steps, not of each batch, so a run of single-domain batches is not pushed to
        spread over every patch.
        """
        counts = torch.bincount(top_idx.flatten(), minlength=self.num_patches).to(scores.dtype)
        fraction = self.balance_usage(counts / counts.sum())
        mean_prob = scores.softmax(dim=-1).mean(dim=0)
        return self.num_patches * (fraction * mean_prob).sum() - 1.0

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = F.layer_norm(hidden_states.reshape(-1, shape[-1]), (shape[-1],))
        top_idx, weights, scores = self.route(x)
        if self.code_encoder == "shared":
            code = self.encoder(x).unsqueeze(1)  # (N, 1, r), shared by the chosen patches
        else:
            code = self.encoder(x, top_idx)  # (N, k, r), each chosen patch's own
        gated = code * torch.sigmoid(self.gate_scale[top_idx] * code + self.gate_bias[top_idx])  # (N, k, r)
        rows = top_idx.unsqueeze(-1) * self.rank + torch.arange(self.rank, device=x.device)  # (N, k, r)
        per_row = (weights.unsqueeze(-1) * gated).flatten(1)  # (N, k*r)
        delta = F.embedding_bag(rows.flatten(1), self.decoders, per_sample_weights=per_row, mode="sum")
        if self.training:
            self.aux_loss = self.load_balance_loss(top_idx, scores)
            self.step_counts = torch.bincount(top_idx.flatten(), minlength=self.num_patches).detach()
        return (self.gamma * self.dropout(delta)).reshape(shape)

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one token's forward: routing, code (one, or one per chosen patch), k gates,
        k decoders."""
        d, r, k, K = self.hidden_size, self.rank, self.top_k, self.num_patches
        codes = 1 if self.code_encoder == "shared" else k
        return 2 * (K * d + codes * d * r + k * r * d) + 4 * k * r

    def extra_repr(self) -> str:
        extra = "" if self.code_encoder == "shared" else f", code_encoder={self.code_encoder}"
        extra += f", balance_horizon={self.balance_horizon}" if self.balance_horizon > 1 else ""
        return (f"hidden={self.hidden_size}, patches={self.num_patches}, top_k={self.top_k}, rank={self.rank}, "
                f"tau={self.tau}, gamma={self.gamma}{extra}")


class AdapterFFN(FixedInEval, nn.Module):
    """Pre-LN block FFN (ViT/GPT-2 ``mlp``): frozen FFN(h) + patches(h)."""

    def __init__(self, base: nn.Module, patches: PatchFFN) -> None:
        super().__init__()
        self.base, self.patches = base, patches

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.base(hidden_states) + self.patches(hidden_states)


class PostNormAdapterOutput(FixedInEval, nn.Module):
    """BERT ``output(intermediate, x) = LN(dense(intermediate) + x)``: the patches' residual,
    computed from the FFN input x, joins the residual stream before the LayerNorm, i.e.
    LN(x + FFN(x) + patches(x)) - the routed residual beside the frozen FFN."""

    def __init__(self, base: nn.Module, patches: PatchFFN) -> None:
        super().__init__()
        self.base, self.patches = base, patches

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.base(hidden_states, input_tensor + self.patches(input_tensor))
