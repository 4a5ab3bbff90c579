"""Hopfield pooling: m routing prompts computed in closed form from a block's tokens.

For tokens Z (L x d), frozen W_K and W_V, and queries Q (m x d):

    K = Z W_K,   V = Z W_V,   A = softmax_rows(beta Q K^T),   P = A V.

Row a of A is the unique minimiser over the simplex of the strictly convex free
energy F(p; q_a) = -sum_i p_i <q_a, k_i> + beta^-1 sum_i p_i log p_i (its
stationarity condition gives p_i proportional to exp(beta <q_a, k_i>)), so the
routing needs no inner optimisation, and since softmax is 1-Lipschitz, A moves
at most beta |q_a| |W_K| |dZ| when the tokens move by dZ.

Frozen W_K, W_V (buffers, never trained). Default init is the identity: with a
trainable query projection, any fixed invertible W_K is absorbed by W_Q (Q K^T =
S (W_Q W_K^T) Z^T), and W_V = I makes every prompt a convex mixture of the
block's own tokens, i.e. an input the frozen attention was trained on. A seeded
random orthogonal init is offered for both (it preserves norms, so beta keeps
its meaning).

Padding: keys marked invalid get no routing weight. Causal LMs: prompts come in
groups, one group per chunk of ``chunk_size`` positions; group g pools only the
tokens at positions <= g * chunk_size (the chunk's first position), so the
prompts used by position t depend on no token after t.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import RwfConfig


def _init_matrix(kind: str, dim: int, generator: torch.Generator) -> torch.Tensor:
    if kind == "identity":
        return torch.eye(dim)
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()  # sign fix: a uniformly random rotation


class HopfieldRouter(nn.Module):
    """``forward(Z, key_valid) -> (P, prompt_valid)``; ``routing_weights`` gives A."""

    def __init__(self, hidden_size: int, config: RwfConfig, seed: int = 0) -> None:
        super().__init__()
        self.num_prompts = config.num_prompts
        self.beta = config.beta if config.beta is not None else 1.0 / math.sqrt(hidden_size)
        generator = torch.Generator().manual_seed(seed)
        # Frozen: registered as buffers so no optimiser can ever see them; saved with
        # the adapter (they are not backbone tensors) so a reload is bit-identical.
        self.register_buffer("key_weight", _init_matrix(config.key_init, hidden_size, generator))
        self.register_buffer("value_weight", _init_matrix(config.value_init, hidden_size, generator))
        queries = torch.randn(config.num_prompts, hidden_size, generator=generator) * config.query_init_std
        self.queries = nn.Parameter(queries)  # S (projected mode) or Q itself (static mode)
        self.query_proj: nn.Linear | None = None
        if config.query_mode == "projected":
            self.query_proj = nn.Linear(hidden_size, hidden_size)
            with torch.no_grad():
                self.query_proj.weight.copy_(
                    torch.eye(hidden_size) if config.query_projection_init == "identity" else torch.zeros(hidden_size, hidden_size)
                )
                self.query_proj.bias.zero_()

    def query(self) -> torch.Tensor:
        """Q (m x d): the only trained part of the router."""
        return self.queries if self.query_proj is None else self.query_proj(self.queries)

    def routing_weights(
        self, tokens: torch.Tensor, key_valid: torch.Tensor | None = None, chunk_size: int | None = None
    ) -> torch.Tensor:
        """A: (B, G, m, L) weights over the L tokens for G prompt groups (G = 1 unless causal).

        ``key_valid`` (B, L) bool marks real tokens; ``chunk_size`` (causal) makes
        group g see only positions <= g * chunk_size. A group with no visible real
        token gets all-zero weights (its prompts are zero and flagged invalid).
        """
        batch, length, _ = tokens.shape
        # Q K^T = (Q W_K^T) Z^T: the frozen projection is applied to the m queries, not the L tokens.
        query = self.query().to(tokens.dtype) @ self.key_weight.to(tokens.dtype).T
        scores = self.beta * torch.einsum("md,bld->bml", query, tokens)  # (B, m, L)
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
        return torch.softmax(scores, dim=-1) * routed[..., None].to(scores.dtype)

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
        prompts = prompts.flatten(1, 2)
        valid = (weights.sum(-1) > 0).flatten(1, 2)
        return prompts, valid
