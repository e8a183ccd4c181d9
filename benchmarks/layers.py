"""The layers the benchmark compares, built with one set of weights, and the calls it times.

Five ways to compute GPT-2-small causal self-attention (see ``attention.py``), and for one decoding step,
mha's layer with its two caches against ``MinimalDecoder``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from config import Config
from torch import nn

import mha

IMPLS = ["reference", "mha fused", "mha explicit", "torch fused", "torch weights"]
MODES = ["forward", "forward+backward"]
DECODE_IMPLS = ["minimal", "mha KVCache(max_len)", "mha KVCache()"]


class MinimalFused(nn.Module):
    """One Linear for Q, K, V; F.scaled_dot_product_attention(is_causal=True); one Linear."""

    def __init__(self, d_model: int, h: int, device=None, dtype=None) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.out = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d_k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
        return self.out(o.transpose(1, 2).reshape(B, T, D))  # (B, T, d_model)


def weights(ours: mha.MultiHeadAttention) -> dict:
    """Our layer's state_dict: qkv.weight, qkv.bias, out.weight, out.bias, the minimal layers' names and shapes, so
    they load it strictly (its h travels in the metadata, which they ignore)."""
    return ours.state_dict()


def build_layers(cfg: Config, device: torch.device):
    """The three modules, sharing one set of weights."""
    ours = mha.MultiHeadAttention(cfg.d_model, cfg.h, device=device)
    theirs = mha.to_torch(ours)
    ref = MinimalFused(cfg.d_model, cfg.h, device=device)
    ref.load_state_dict(weights(ours))
    return ours, theirs, ref


def calls(ours, theirs, ref, x: torch.Tensor):
    """name -> a function of no arguments that returns the layer's output (B, T, d_model)."""
    T = x.size(1)
    blocked = mha.to_torch_attn_mask(mha.causal_mask(T, device=x.device))  # True = blocked, (T, T)
    return {
        "reference": lambda: ref(x),
        "mha fused": lambda: ours(x, need_weights=False)[0],
        "mha explicit": lambda: ours(x, need_weights=True)[0],
        "torch fused": lambda: theirs(x, x, x, attn_mask=blocked, need_weights=False, is_causal=True)[0],
        "torch weights": lambda: theirs(
            x, x, x, attn_mask=blocked, need_weights=True, average_attn_weights=False
        )[0],
    }


def check_agreement(ours, theirs, ref, cfg: Config, device: torch.device) -> None:
    """All five compute the same function (and both weights tables agree): like is compared with like."""
    T = min(cfg.lengths)
    x = torch.randn(cfg.batch, T, cfg.d_model, device=device)
    for training in (True, False):  # eval mode is where nn.MultiheadAttention takes its fast path
        for m in (ours, theirs, ref):
            m.train(training)
        with torch.no_grad():
            outs = {name: f() for name, f in calls(ours, theirs, ref, x).items()}
            _, w_ours = ours(x, need_weights=True)
            _, w_theirs = theirs(
                x, x, x, attn_mask=mha.to_torch_attn_mask(mha.causal_mask(T, device=device)),
                average_attn_weights=False,
            )
        for name, y in outs.items():
            if not torch.allclose(y, outs["reference"], atol=1e-5, rtol=1e-4):
                diff = (y - outs["reference"]).abs().max()
                raise AssertionError(f"{name} differs from the reference by {diff} (training={training})")
        if not torch.allclose(w_ours, w_theirs, atol=1e-6):
            raise AssertionError(f"mha and nn.MultiheadAttention weights differ (training={training})")
    for m in (ours, theirs, ref):
        m.eval()


class MinimalDecoder(nn.Module):
    """The least one decoding step can do: one Linear for Q, K, V, ``F.scaled_dot_product_attention``
    over a preallocated K/V cache, one Linear. No checks and no options."""

    def __init__(self, d_model: int, h: int, device=None, dtype=None) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.out = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int) -> torch.Tensor:
        """x (B, 1, d_model), the token at position ``pos``; caches (B, h, max_len, d_k), filled up to ``pos``."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, 1, d_k)
        k_cache[:, :, pos : pos + T] = k
        v_cache[:, :, pos : pos + T] = v
        # The one new token is the last position: it attends to every cached key, so there is no mask.
        o = F.scaled_dot_product_attention(q, k_cache[:, :, : pos + T], v_cache[:, :, : pos + T])  # (B, h, 1, d_k)
        return self.out(o.transpose(1, 2).reshape(B, T, D))  # (B, 1, d_model)


def generations(ours, ref: MinimalDecoder, x: torch.Tensor) -> dict:
    """name -> a function that feeds x (B, N, d_model) in one token per call, from an empty cache,
    and returns the N outputs, each (B, 1, d_model)."""
    B, N, d_model = x.shape
    h = ref.h

    def minimal():
        k_cache = x.new_empty(B, h, N, d_model // h)  # allocated per generation, as mha's preallocated cache is
        v_cache = x.new_empty(B, h, N, d_model // h)
        return [ref(x[:, t : t + 1], k_cache, v_cache, t) for t in range(N)]

    def with_cache(max_len):
        def run():
            cache = mha.KVCache(max_len=max_len)
            return [ours(x[:, t : t + 1], cache=cache, need_weights=False)[0] for t in range(N)]
        return run

    return {"minimal": minimal, "mha KVCache(max_len)": with_cache(N), "mha KVCache()": with_cache(None)}
