"""The bug zoo's layers: MultiHeadAttention classes with the mistakes learners make, one per class.

Each is written the way a learner writes it, in the article's style, with exactly one bug (marked
`# BUG`), or, for the last ones, a layout or a habit that is right only at some sizes. tests/bug_zoo.py
lists them in ``ZOO`` with the word and the words of the message the checker must give.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

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


class ProjectsEachSlice(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(self.d_k, 3 * self.d_k)  # BUG: each head projects only its own d_k-wide slice of x
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x.view(B, T, self.h, self.d_k).transpose(1, 2)).split(self.d_k, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, D)), w


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


class CausalMaskAdded(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores + torch.tril(torch.ones(T, T))  # BUG: the article's float mask, added: blocks nothing
        w = scores.softmax(dim=-1)
        y = (w @ v).transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


class HeadsSummed(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(self.d_k, d_model)  # BUG (with forward): the heads are added up, so W_O gets d_k

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        return self.out(sum((w @ v).unbind(1))), w  # BUG: the heads added instead of concatenated


class HeadsSummedAndRepeated(_Layers):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        y = (w @ v).sum(dim=1).repeat(1, 1, self.h)  # BUG: heads added, then copied h times so that W_O fits
        return self.out(y), w


# --- layouts and habits that are right only at some sizes ---------------------------------------


class Article(_Layers):
    """The article's forward, right, for the members below to change one step of."""

    def heads(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        return (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        return self.project_out((w @ v).transpose(1, 2).reshape(B, T, D)), w

    def project_out(self, y):
        return self.out(y)


class QKVReadHeadByHead(Article):
    def heads(self, x):
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, self.h, 3 * self.d_k)  # LAYOUT: [q_0, k_0, v_0, q_1, ...], GPT-NeoX's
        return (t.transpose(1, 2) for t in qkv.split(self.d_k, dim=-1))


class OutWeightAsStored(Article):
    def project_out(self, y):
        return y @ self.out.weight + self.out.bias  # BUG: nn.Linear's weight is (out, in): self.out(y)


class MaskBufferOfFixedSize(Article):
    """nanoGPT's habit: a causal mask made once, in __init__, for sequences of up to 16 tokens."""

    def __init__(self, d_model, h, block_size=16):
        super().__init__(d_model, h)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if causal:
            scores = scores.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))  # SIZE: T <= 16 only
        w = F.softmax(scores, dim=-1)
        return self.out((w @ v).transpose(1, 2).contiguous().view(B, T, D)), w


class ScaleOfTheFirstProbe(Article):
    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / 2.0  # SIZE: √d_k for d_k = 4 only
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = scores.softmax(dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, D)), w


class CastsToFloat32(Article):
    def forward(self, x, causal=True):
        return super().forward(x.float(), causal)  # DTYPE: right for float32 inputs only


class SqueezesTheWeights(Article):
    def forward(self, x, causal=True):
        y, w = super().forward(x, causal)
        return y, w.squeeze()  # SIZE: drops B or h when they are 1


class SeparateProjections(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h = h
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model) for _ in range(3))  # LAYOUT: no qkv
        self.out = nn.Linear(d_model, d_model)


class AveragedWeights(Article):
    def forward(self, x, causal=True):
        y, w = super().forward(x, causal)
        return y, w.mean(dim=1)  # BUG: the weights of every head are asked for, not their average


class AlwaysCausal(Article):
    def forward(self, x, causal=True):
        return super().forward(x, True)  # BUG: causal=False is ignored


class ForgetsTheBatch(Article):
    def forward(self, x, causal=True):
        y, w = super().forward(x, causal)
        return y[0], w  # BUG: (T, d_model), the first sentence only
