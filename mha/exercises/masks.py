"""Checker for converting a keep-mask into nn.MultiheadAttention's attn_mask."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._core import Mistake, call, checker, difference, matches, shape
from .attention import _KEEP
from .mistakes import say

D_MODEL, HEADS, B = 6, 2, 2


def _module_and_inputs():
    """An nn.MultiheadAttention with weights from a generator of its own, and probe inputs."""
    with torch.random.fork_rng(devices=[]):  # building it draws from the global RNG; give it back untouched
        m = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(D_MODEL))
    T, S = _KEEP.shape
    causal = torch.ones(T + 1, T + 1, dtype=torch.bool).tril()
    x_cross = torch.randn(B, T, D_MODEL, generator=g)
    context = torch.randn(B, S, D_MODEL, generator=g)
    x_self = torch.randn(B, T + 1, D_MODEL, generator=g)
    return m, [
        (_KEEP, x_cross, context, f"for an irregular {shape(T, S)} keep-mask (cross-attention, T={T}, S={S})"),
        (causal, x_self, x_self, f"for a causal {shape(T + 1, T + 1)} keep-mask (self-attention)"),
    ]


def _attend(m, attn_mask, x, context):
    return m(x, context, context, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)


@checker("to_torch_attn_mask", "fn(keep)")
def check_torch_attn_mask(fn) -> str:
    """Check ``fn(keep)``: a bool keep-mask (T, S), True = may attend, -> ``nn.MultiheadAttention``'s ``attn_mask``.

    ``nn.MultiheadAttention`` reads a bool ``attn_mask`` the other way round
    (True = blocked) and adds a float one to the scores, so both ``~keep`` and
    a float mask with -inf where blocked are right answers. The checker runs an
    ``nn.MultiheadAttention`` (d_model 6, 2 heads, float32, its own weights)
    with the returned mask and compares y and the per-head weights with the
    right ones, for an irregular (4, 6) mask and a causal (5, 5) one.

    Names the mistakes "inverted" for a keep-mask passed through as it is and
    "float mask" for a mask of finite floats such as 0s and 1s (added to the
    scores, it blocks nothing); also recognises a (S, T) mask, a float mask of
    another dtype than the module's, and a mask changed in place.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not done yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    m, probes = _module_and_inputs()
    for keep, x, context, probe in probes:
        given = keep.clone()
        attn_mask = call(fn, given, what="your to_torch_attn_mask", probe=probe)
        if not torch.equal(given, keep):
            raise Mistake(say("mask changed in place"), probe=probe)
        if not isinstance(attn_mask, torch.Tensor):
            raise Mistake(f"it should return a torch.Tensor, but it returned a {type(attn_mask).__name__}", probe=probe)
        T, S = keep.shape
        if T != S and attn_mask.shape == (S, T):
            raise Mistake(say("mask keys by queries", got=shape(S, T), want=shape(T, S)), probe=probe)
        hint = say("float mask dtype", dtype=attn_mask.dtype) if attn_mask.dtype not in (torch.bool, x.dtype) else ""
        y, w = call(_attend, m, attn_mask, x, context, what="nn.MultiheadAttention with your attn_mask", probe=probe,
                    hint=hint)
        right_y, right_w = _attend(m, ~keep, x, context)
        if matches(w, right_w) and matches(y, right_y):
            continue
        if matches(w, _attend(m, keep, x, context)[1]):
            raise Mistake(say("torch mask inverted"), "inverted", probe=probe)
        if attn_mask.is_floating_point() and bool(torch.isfinite(attn_mask).all()):
            raise Mistake(say("float mask blocks nothing"), "float mask", probe=probe)
        if w.isnan().any() and not right_w.isnan().any():
            raise Mistake(say("zero times inf"), probe=probe)
        raise Mistake(difference(w, right_w, "the per-head weights"), probe=probe)
    return "nn.MultiheadAttention with your attn_mask attends exactly where the keep-mask is True (two probes)."
