"""The small causal language model of notebook 06: word embeddings, learned positions, pre-LayerNorm blocks whose
attention is :class:`mha.MultiHeadAttention`, and an unembedding tied to the embedding (as GPT-2's).
"""

from __future__ import annotations

import torch
from torch import nn

from ..multihead import MultiHeadAttention


class Block(nn.Module):
    """x + attention(LayerNorm(x)), then + MLP(LayerNorm(.)): GPT-2's block, with mha's attention layer."""

    def __init__(self, d_model: int, h: int, mlp: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, h)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp * d_model), nn.GELU(), nn.Linear(mlp * d_model, d_model))

    def forward(self, x: torch.Tensor, need_weights: bool = False):
        y, w = self.attn(self.ln1(x), causal=True, need_weights=need_weights)
        x = x + y
        return x + self.mlp(self.ln2(x)), w


class WordLM(nn.Module):
    """A causal language model over word ids.

    Args:
        vocab_size, d_model, h (heads per layer), layers, context (the longest window, for the positions),
        mlp (the MLP's width as a multiple of d_model).

    ``forward(ids, need_weights=False)`` takes ids (B, T) int64 with T <= context and returns
    ``(logits, weights)``: logits (B, T, vocab_size), and a list of ``layers`` tensors (B, h, T, T) of
    attention weights (rows are queries, causal: a query sees keys 0..i), or of None without need_weights.

    Raises:
        ValueError: ids is not 2-D int64, is longer than the context, or holds an id outside [0, vocab_size)
            (names it; words outside the vocabulary are id 0, ``<unk>``: ``mha.english.data.encode`` maps them).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, h: int = 4, layers: int = 3, context: int = 128,
                 mlp: int = 4) -> None:
        super().__init__()
        self.config = dict(vocab_size=vocab_size, d_model=d_model, h=h, layers=layers, context=context, mlp=mlp)
        self.emb = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, h, mlp) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        nn.init.normal_(self.emb.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, ids: torch.Tensor, need_weights: bool = False):
        x, weights = self._blocks(ids, need_weights)
        return self.ln(x) @ self.emb.weight.T, weights

    def attention_weights(self, ids: torch.Tensor) -> torch.Tensor:
        """Every head's weights for ids (B, T): (B, layers, h, T, T), without computing the logits."""
        return torch.stack(self._blocks(ids, True)[1], 1)

    def _blocks(self, ids, need_weights):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
            got = f"{ids.dtype} tensor of shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids)
            raise ValueError(f"ids must be an int64 tensor (B, T); got a {got}")
        if ids.size(1) > self.pos.num_embeddings:
            raise ValueError(f"ids has T={ids.size(1)}, longer than the model's context {self.pos.num_embeddings}: "
                             f"cut it into windows of at most {self.pos.num_embeddings}")
        V = self.emb.num_embeddings
        outside = (ids < 0) | (ids >= V)
        if ids.device.type != "meta" and bool(outside.any()):  # F.embedding would raise a bare IndexError (C32)
            raise ValueError(f"ids holds {ids[outside][0].item()}, outside the vocabulary: word ids are 0 to {V - 1} "
                             f"(vocab_size={V}), and id 0 is <unk>, the id of every word outside the vocabulary; "
                             "encode words with mha.english.data.encode(words, itos), which maps those to 0")
        x = self.emb(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        weights = []
        for block in self.blocks:
            x, w = block(x, need_weights)
            weights.append(w)
        return x, weights
