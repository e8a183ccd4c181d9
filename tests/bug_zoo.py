"""The bug zoo: attention code with the mistakes learners make, one mistake per member.

Each member is written the way a learner writes it, in the article's style, with
exactly one bug (marked `# BUG`). Most of them run without an error and return
tensors of the right shape. ``ZOO`` lists, per checker, each member and the
word (a key of ``mha.exercises.MISTAKES``) the checker must name it by.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

# --- split_heads(x, h): (B, T, D) -> (B, h, T, D // h) -------------------------------------


def split_heads_without_transpose(x, h):
    B, T, D = x.shape
    return x.view(B, h, T, D // h)  # BUG: cuts the sequence, not each token's vector


def split_heads_transpose_forgotten(x, h):
    B, T, D = x.shape
    return x.view(B, T, h, D // h)  # BUG: (B, T, h, d_k), the transpose(1, 2) is missing


# --- merge_heads(x): (B, h, T, d_k) -> (B, T, h*d_k) ------------------------------------------


def merge_heads_without_transpose(x):
    B, h, T, d_k = x.shape
    return x.reshape(B, T, h * d_k)  # BUG: mixes heads with time steps (case C6)


def merge_heads_summed(x):
    return x.sum(dim=1)  # BUG: adds the heads up instead of concatenating them


def merge_heads_averaged(x):
    return torch.mean(x, dim=1)  # BUG: averages the heads instead of concatenating them


# --- attention(q, k, v, mask=None) -> (out, weights); mask: True = may attend -------------------


def attention_without_scale(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)  # BUG: no 1/sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_divided_by_d_k(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / d_k  # BUG: 1/d_k instead of 1/sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def attention_scale_precedence(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) * d_k ** -1 / 2  # BUG: that is (1/d_k) / 2, not d_k ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_softmax_over_queries(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-2)  # BUG: normalises over the queries
    return weights @ v, weights


def attention_mask_inverted(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # BUG: blocks where the keep-mask is True
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_averages_keys(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ k, weights  # BUG: K where V belongs


# --- MultiHeadAttention(d_model, h): qkv, out, forward(x, causal=True) -> (y, w) ---------------


class _Layers(nn.Module):
    """The article's __init__, shared by the zoo's classes (their forward has the bug)."""

    def __init__(self, d_model, h):
        super().__init__()
        assert d_model % h == 0
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model)  # rows [W_Q; W_K; W_V]
        self.out = nn.Linear(d_model, d_model)  # W_O


class SplitWithoutTranspose(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, self.h, T, self.d_k) for t in (q, k, v))  # BUG: no view(B, T, h, d_k).transpose
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


class MergeWithoutTranspose(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ v).reshape(B, T, D)  # BUG: merges heads without transpose(1, 2)
        return self.out(y), w


class ScaledByDModel(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # BUG: sqrt(d_model) instead of sqrt(d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


class SoftmaxOverHeads(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = F.softmax(scores, dim=1)  # BUG: dim=1 was the key dim in the (T, T) version; here it is the heads
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


class CausalMaskInverted(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            tril = torch.tril(torch.ones(T, T)).bool()
            scores = scores.masked_fill(tril, float("-inf"))  # BUG: blocks the past, keeps the future
        w = scores.softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


class AveragesKeys(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ k).transpose(1, 2).reshape(B, T, D)  # BUG: K where V belongs
        return self.out(y), w


class HeadsSeeTheirSlice(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        h, d_k = self.h, self.d_k
        xs = x.view(B, T, h, d_k)  # BUG: head i gets only its slice of the embedding...
        W, b = self.qkv.weight.view(3, h, d_k, h, d_k), self.qkv.bias.view(3, h, 1, d_k)
        W_own = torch.stack([W[:, i, :, i, :] for i in range(h)], dim=1)  # ...and its own (d_k, d_k) blocks
        q, k, v = torch.einsum("bthe,jhde->jbhtd", xs, W_own) + b[:, None]  # each (B, h, T, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


class NoOutputProjection(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model)  # BUG: no self.out = nn.Linear(d_model, d_model)

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        return (w @ v).transpose(1, 2).reshape(B, T, D), w


class OutputProjectionUnused(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return y, w  # BUG: self.out (W_O) is never applied


class HeadsAveraged(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(self.d_k, d_model)  # BUG (with forward): the heads are averaged, so W_O gets d_k

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        return self.out((w @ v).mean(dim=1)), w  # BUG: mean over heads instead of concatenating them


class CausalIgnored(_Layers):
    def forward(self, x, causal=True):  # BUG: causal is accepted and never used
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        w = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


# --- to_torch_attn_mask(keep): keep-mask (T, S) -> nn.MultiheadAttention's attn_mask ---------------


def torch_mask_passed_through(keep):
    return keep  # BUG: nn.MultiheadAttention reads True as *blocked*


def torch_mask_as_float(keep):
    return keep.float()  # BUG (not in the table): a float attn_mask is added to the scores, blocking nothing


# Per checker: each member and the word its message must contain.
ZOO = {
    "check_split_heads": [
        (split_heads_without_transpose, "transpose"),
        (split_heads_transpose_forgotten, "transpose"),
    ],
    "check_merge_heads": [
        (merge_heads_without_transpose, "transpose"),
        (merge_heads_summed, "concat"),
        (merge_heads_averaged, "concat"),
    ],
    "check_attention": [
        (attention_without_scale, "scale"),
        (attention_divided_by_d_k, "scale"),
        (attention_scale_precedence, "scale"),
        (attention_softmax_over_queries, "softmax"),
        (attention_mask_inverted, "inverted"),
        (attention_averages_keys, "value"),
    ],
    "check_multi_head_attention": [
        (SplitWithoutTranspose, "transpose"),
        (MergeWithoutTranspose, "transpose"),
        (ScaledByDModel, "scale"),
        (SoftmaxOverHeads, "softmax"),
        (CausalMaskInverted, "inverted"),
        (AveragesKeys, "value"),
        (HeadsSeeTheirSlice, "slice"),
        (NoOutputProjection, "W_O"),
        (OutputProjectionUnused, "W_O"),
        (HeadsAveraged, "concat"),
        (CausalIgnored, "causal"),
    ],
    "check_torch_attn_mask": [
        (torch_mask_passed_through, "inverted"),
    ],
}
