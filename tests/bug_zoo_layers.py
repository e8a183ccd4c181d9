"""The bug zoo's layers: MultiHeadAttention classes with the mistakes learners make, one per class.

``Article`` is the article's layer, right, one step per method; each member changes one step, the way a learner
writes it, with exactly one bug (marked `# BUG`), or a layout or a habit that is right only at some sizes (`# SIZE`,
`# LAYOUT`, `# DTYPE`). tests/bug_zoo.py lists them in ``ZOO`` with the word and the words of the checker's message.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

# --- MultiHeadAttention(d_model, h): qkv, out, forward(x, causal=True) -> (y, w) ---------------


class Article(nn.Module):
    """The article's layer, right: the members below change one step of it."""

    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model)  # rows [W_Q; W_K; W_V]
        self.out = nn.Linear(d_model, d_model)  # W_O

    def heads(self, x):  # (B, T, d_model) -> q, k, v, each (B, h, T, d_k)
        B, T, D = x.shape
        return (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))

    def scale(self):
        return 1 / math.sqrt(self.d_k)

    def mask(self, scores, causal):
        T = scores.size(-1)
        return scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")) if causal else scores

    def softmax(self, scores):
        return scores.softmax(dim=-1)

    def mix(self, w, k, v):
        return w @ v

    def merge(self, o):  # (B, h, T, d_k) -> (B, T, h·d_k)
        B, h, T, d_k = o.shape
        return o.transpose(1, 2).reshape(B, T, h * d_k)

    def project_out(self, y):
        return self.out(y)

    def forward(self, x, causal=True):
        q, k, v = self.heads(x)
        w = self.softmax(self.mask(q @ k.transpose(-2, -1) * self.scale(), causal))
        return self.project_out(self.merge(self.mix(w, k, v))), w


class SplitWithoutTranspose(Article):
    def heads(self, x):
        B, T, D = x.shape
        return (t.reshape(B, self.h, T, self.d_k) for t in self.qkv(x).split(D, dim=-1))  # BUG: no view + transpose


class MergeWithoutTranspose(Article):
    def merge(self, o):
        B, h, T, d_k = o.shape
        return o.reshape(B, T, h * d_k)  # BUG: merges heads without transpose(1, 2)


class ScaledByDModel(Article):
    def scale(self):
        return 1 / math.sqrt(self.h * self.d_k)  # BUG: sqrt(d_model) instead of sqrt(d_k)


class SoftmaxOverHeads(Article):
    def softmax(self, scores):
        return F.softmax(scores, dim=1)  # BUG: dim=1 was the key dim in the (T, T) version; here it is the heads


class CausalMaskInverted(Article):
    def mask(self, scores, causal):
        T = scores.size(-1)
        tril = torch.tril(torch.ones(T, T)).bool()
        return scores.masked_fill(tril, float("-inf")) if causal else scores  # BUG: blocks the past, keeps the future


class CausalIgnored(Article):
    def mask(self, scores, causal):
        return scores  # BUG: causal is accepted and never used


class CausalMaskAdded(Article):
    def mask(self, scores, causal):
        T = scores.size(-1)
        return scores + torch.tril(torch.ones(T, T)) if causal else scores  # BUG: the article's float mask, added


class AlwaysCausal(Article):
    def forward(self, x, causal=True):
        return super().forward(x, True)  # BUG: causal=False is ignored


class MaskBufferOfFixedSize(Article):  # nanoGPT's habit: a causal mask made once, in __init__, for T <= 16
    def __init__(self, d_model, h, block_size=16):
        super().__init__(d_model, h)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def mask(self, scores, causal):
        T = scores.size(-1)
        return scores.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")) if causal else scores  # SIZE: T <= 16


class AveragesKeys(Article):
    def mix(self, w, k, v):
        return w @ k  # BUG: K where V belongs


class HeadsSeeTheirSlice(Article):
    def heads(self, x):
        B, T, D = x.shape
        h, d_k = self.h, self.d_k
        xs = x.view(B, T, h, d_k)  # BUG: head i gets only its slice of the embedding...
        W, b = self.qkv.weight.view(3, h, d_k, h, d_k), self.qkv.bias.view(3, h, 1, d_k)
        W_own = torch.stack([W[:, i, :, i, :] for i in range(h)], dim=1)  # ...and its own (d_k, d_k) blocks
        return torch.einsum("bthe,jhde->jbhtd", xs, W_own) + b[:, None]  # q, k, v, each (B, h, T, d_k)


class ProjectsEachSlice(Article):
    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        self.qkv = nn.Linear(self.d_k, 3 * self.d_k)  # BUG: each head projects only its own d_k-wide slice of x

    def heads(self, x):
        B, T, D = x.shape
        return self.qkv(x.view(B, T, self.h, self.d_k).transpose(1, 2)).split(self.d_k, dim=-1)


class NoOutputProjection(Article):
    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        del self.out  # BUG: no self.out = nn.Linear(d_model, d_model)

    def project_out(self, y):
        return y


class OutputProjectionUnused(Article):
    def project_out(self, y):
        return y  # BUG: self.out (W_O) is never applied


class OutWeightAsStored(Article):
    def project_out(self, y):
        return y @ self.out.weight + self.out.bias  # BUG: nn.Linear's weight is (out, in): self.out(y)


class HeadsAveraged(Article):
    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        self.out = nn.Linear(self.d_k, d_model)  # BUG (with merge): the heads are averaged, so W_O gets d_k

    def merge(self, o):
        return o.mean(dim=1)  # BUG: mean over heads instead of concatenating them


class HeadsSummedAndRepeated(Article):
    def merge(self, o):
        return o.sum(dim=1).repeat(1, 1, self.h)  # BUG: heads added, then copied h times so that W_O fits


class QKVReadHeadByHead(Article):
    def heads(self, x):
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, self.h, 3 * self.d_k)  # LAYOUT: [q_0, k_0, v_0, q_1, ...], GPT-NeoX's
        return (t.transpose(1, 2) for t in qkv.split(self.d_k, dim=-1))


class CastsToFloat32(Article):
    def forward(self, x, causal=True):
        return super().forward(x.float(), causal)  # DTYPE: right for float32 inputs only


class SqueezesTheWeights(Article):
    def forward(self, x, causal=True):
        y, w = super().forward(x, causal)
        return y, w.squeeze()  # SIZE: drops B or h when they are 1


class AveragedWeights(Article):
    def forward(self, x, causal=True):
        y, w = super().forward(x, causal)
        return y, w.mean(dim=1)  # BUG: the weights of every head are asked for, not their average


class ForgetsTheBatch(Article):
    def forward(self, x, causal=True):
        y, w = super().forward(x, causal)
        return y[0], w  # BUG: (T, d_model), the first sentence only


class SeparateProjections(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h = h
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model) for _ in range(3))  # LAYOUT: no qkv
        self.out = nn.Linear(d_model, d_model)
