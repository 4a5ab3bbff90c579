"""Hopfield pooling: m routing prompts computed in closed form from a block's tokens.

For tokens Z (L x d), frozen W_K and W_V, and queries Q (m x d):

    K = Z W_K,   V = Z W_V,   A = softmax_rows(beta Q K^T),   P = A V.

That is ``routing="dot"``. The default ``routing="cosine"`` scores cos(q_a, k_i) / tau
instead (the same free energy with normalised queries and keys, beta = 1/tau): on
layer-normed tokens of norm ~sqrt(d), dot scores grow with the query norm as training
moves the queries, and the softmax collapses onto one token per prompt, so the prompts
become static token copies; cosines stay in [-1, 1], so tau alone sets how soft A is.

Row a of A is the unique minimiser over the simplex of the strictly convex free
energy F(p; q_a) = -sum_i p_i <q_a, k_i> + beta^-1 sum_i p_i log p_i (its
stationarity condition gives p_i proportional to exp(beta <q_a, k_i>)), so the
routing needs no inner optimisation, and since softmax is 1-Lipschitz, A moves
at most beta |q_a| |W_K| |dZ| when the tokens move by dZ.

Frozen W_K, W_V (buffers, never trained). Default init is the identity: with a trainable
query projection, any fixed invertible W_K is absorbed by W_Q (Q K^T = S (W_Q W_K^T) Z^T),
and W_V = I makes every prompt a convex mixture of the block's own tokens, i.e. an input the
frozen attention was trained on; routing then re-weights the attention but cannot add a
direction the tokens lack. A seeded random orthogonal init (it preserves norms, so beta keeps
its meaning) and the block's own pretrained projections are the alternatives; W_V is chosen on
validation among the three.

Padding: keys marked invalid get no routing weight. Causal LMs: prompts come in groups, one group per
chunk of ``chunk_size`` positions; group g pools only the tokens at positions <= g * chunk_size (the
chunk's first position), so the prompts used by position t depend on no token after t.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.methods.rwf.config import RwfConfig


def _init_matrix(kind: str, dim: int, generator: torch.Generator) -> torch.Tensor:
    if kind == "identity":
        return torch.eye(dim)
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()  # sign fix: a uniformly random rotation


class HopfieldRouter(nn.Module):
    """``forward(Z, key_valid) -> (P, prompt_valid)``; ``routing_weights`` gives A.

    ``pretrained`` holds the block's own (W_K, W_V, b_V) (as right-multiplied matrices, K = Z W_K),
    required when ``key_init`` or ``value_init`` is ``"pretrained"``.
    """

    def __init__(
        self, hidden_size: int, config: RwfConfig, seed: int = 0,
        pretrained: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.num_prompts = config.num_prompts
        self.routing = config.routing
        self.beta = config.beta if config.beta is not None else config.beta_scale / math.sqrt(hidden_size)
        generator = torch.Generator().manual_seed(seed)
        if "pretrained" in (config.key_init, config.value_init) and pretrained is None:
            raise ValueError("HopfieldRouter: key_init/value_init 'pretrained' needs the block's projections")

        def init(which: int, how: str) -> torch.Tensor:
            return pretrained[which] if how == "pretrained" else _init_matrix(how, hidden_size, generator)

        # Frozen: registered as buffers so no optimiser can ever see them; saved with
        # the adapter (they are not backbone tensors) so a reload is bit-identical.
        key, value = init(0, config.key_init), init(1, config.value_init)
        value_bias = pretrained[2] if config.value_init == "pretrained" else torch.zeros(hidden_size)
        self.register_buffer("key_weight", key.detach().clone().float())
        self.register_buffer("value_weight", value.detach().clone().float())
        self.register_buffer("value_bias", value_bias.detach().clone().float())
        self.key_is_identity = config.key_init == "identity"
        log_temperature = torch.tensor(math.log(config.temperature))
        if config.learn_temperature:
            self.log_temperature = nn.Parameter(log_temperature)
        else:
            self.register_buffer("log_temperature", log_temperature)
        self.health: RoutingHealth | None = None  # set by ``track``: routing statistics of the forwards that follow
        queries = torch.randn(config.num_prompts, hidden_size, generator=generator) * config.query_init_std
        self.queries = nn.Parameter(queries)  # S (projected mode) or Q itself (static mode)
        self.query_proj: nn.Linear | None = None
        if config.query_mode == "projected":
            self.query_proj = nn.Linear(hidden_size, hidden_size)
            with torch.no_grad():
                self.query_proj.weight.copy_(
                    torch.eye(hidden_size) if config.query_projection_init == "identity"
                    else torch.zeros(hidden_size, hidden_size)
                )
                self.query_proj.bias.zero_()

    def query(self) -> torch.Tensor:
        """Q (m x d): the only trained part of the router (with the temperature, if learned)."""
        return self.queries if self.query_proj is None else self.query_proj(self.queries)

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    def scores(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, m, L) routing logits: beta <q, k> (dot) or cos(q, k) / tau (cosine)."""
        query = self.query().to(tokens.dtype)
        if self.routing == "dot":
            # Q K^T = (Q W_K^T) Z^T: the frozen projection is applied to the m queries, not the L tokens.
            return self.beta * torch.einsum("md,bld->bml", query @ self.key_weight.to(tokens.dtype).T, tokens)
        keys = tokens if self.key_is_identity else tokens @ self.key_weight.to(tokens.dtype)
        cosine = torch.einsum("md,bld->bml", F.normalize(query, dim=-1), F.normalize(keys, dim=-1))
        return cosine * torch.exp(-self.log_temperature).to(tokens.dtype)

    def routing_weights(
        self, tokens: torch.Tensor, key_valid: torch.Tensor | None = None, chunk_size: int | None = None
    ) -> torch.Tensor:
        """A: (B, G, m, L) weights over the L tokens for G prompt groups (G = 1 unless causal).

        ``key_valid`` (B, L) bool marks real tokens; ``chunk_size`` (causal) makes
        group g see only positions <= g * chunk_size. A group with no visible real
        token gets all-zero weights (its prompts are zero and flagged invalid).
        """
        batch, length, _ = tokens.shape
        scores = self.scores(tokens)  # (B, m, L)
        visible = torch.ones(batch, 1, length, dtype=torch.bool, device=tokens.device)
        if key_valid is not None:
            visible = visible & key_valid[:, None, :]
        if chunk_size is not None:
            starts = torch.arange(0, length, chunk_size, device=tokens.device)  # first position of each chunk
            positions = torch.arange(length, device=tokens.device)
            visible = visible & (positions[None, :] <= starts[:, None])[None]  # (B, G, L)
        # A group that sees no real token (left padding) routes nothing; unmasking its row
        # first keeps the softmax (and its gradient) free of NaN.
        routed = visible.any(-1, keepdim=True)  # (B, G, 1)
        scores = scores[:, None].masked_fill(~(visible | ~routed)[:, :, None, :], float("-inf"))  # (B, G, m, L)
        weights = torch.softmax(scores, dim=-1) * routed[..., None].to(scores.dtype)
        if self.health is not None:
            self.health.add(weights.detach(), (visible | ~routed).sum(-1))
        return weights

    def forward(
        self, tokens: torch.Tensor, key_valid: torch.Tensor | None = None, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts (B, G*m, d) and their validity (B, G*m) bool, group-major."""
        weights = self.routing_weights(tokens, key_valid, chunk_size)  # (B, G, m, L)
        value_weight = self.value_weight.to(tokens.dtype)
        if weights.shape[1] * weights.shape[2] <= tokens.shape[1]:  # A (Z W_V) = (A Z) W_V: project the fewer rows
            prompts = torch.einsum("bgml,bld->bgmd", weights, tokens) @ value_weight
        else:
            prompts = torch.einsum("bgml,bld->bgmd", weights, tokens @ value_weight)
        # A row of A sums to 1 (0 for a prompt that routes nothing), so A (Z W_V + b_V) = A Z W_V + b_V.
        prompts = prompts + weights.sum(-1, keepdim=True) * self.value_bias.to(tokens.dtype)
        prompts = prompts.flatten(1, 2)
        valid = (weights.sum(-1) > 0).flatten(1, 2)
        return prompts, valid


class RoutingHealth:
    """Running statistics of a router's weights A over the inputs it saw while tracked.

    * ``entropy_ratio``: mean entropy of a prompt's weights / log(number of tokens it could see)
      (1 = uniform pooling, 0 = one token);
    * ``top_weight``: mean largest weight of a prompt;
    * ``same_top_token``: for each prompt, the fraction of inputs whose largest weight falls on
      the prompt's most frequent token position, averaged over prompts (1 = the prompt copies one
      fixed position for every input: routing that ignores the input).
    """

    def __init__(self) -> None:
        self.rows = 0
        self.entropy = 0.0
        self.top = 0.0
        self.top_counts: torch.Tensor | None = None  # (prompts, positions): how often each position is the top

    @torch.no_grad()
    def add(self, weights: torch.Tensor, visible: torch.Tensor) -> None:
        """``weights`` (B, G, m, L); ``visible`` (B, G): tokens each group could see."""
        routed = weights.sum(-1) > 0  # (B, G, m)
        p = weights.float().clamp_min(1e-30)
        entropy = -(weights.float() * p.log()).sum(-1)
        log_n = visible.float().clamp_min(2).log()[..., None]
        self.rows += int(routed.sum())
        self.entropy += float((entropy / log_n)[routed].sum())
        self.top += float(weights.float().amax(-1)[routed].sum())
        batch, groups, m, length = weights.shape
        top = weights.argmax(-1).reshape(batch, groups * m)  # (B, prompts)
        counts = torch.zeros(groups * m, length)
        counts.scatter_add_(1, top.T.cpu(), routed.reshape(batch, groups * m).T.float().cpu())
        self.top_counts = counts if self.top_counts is None else _add_padded(self.top_counts, counts)

    def summary(self) -> dict[str, float]:
        if not self.rows or self.top_counts is None:
            return {"entropy_ratio": float("nan"), "top_weight": float("nan"), "same_top_token": float("nan")}
        totals = self.top_counts.sum(1)
        used = totals > 0
        same = (self.top_counts.amax(1)[used] / totals[used]).mean()
        return {"entropy_ratio": self.entropy / self.rows, "top_weight": self.top / self.rows,
                "same_top_token": float(same)}


def _add_padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b for 2-d counts whose shapes may differ (inputs of other lengths): zero-padded."""
    out = torch.zeros(max(a.shape[0], b.shape[0]), max(a.shape[1], b.shape[1]))
    out[: a.shape[0], : a.shape[1]] += a
    out[: b.shape[0], : b.shape[1]] += b
    return out
