"""Checker for scaled dot-product attention with a keep-mask."""

from __future__ import annotations

import math

import torch

from ._core import Mistake, call, checker, difference, expect_pair, matches, shape
from .mistakes import SOFTMAX_OVER, fit_scale, say, scale_names, wrong_scale

# Every size of the first probes differs (B=2, h=3, T=4, S=6, d_k=8, d_v=5), so a wrong scale, a softmax over
# the wrong dim and K used as V each give a different answer, and T != S shows which side of the (T, S) table a
# mask or a softmax was applied to. The later probes change what code can get right by accident: another d_k
# (a scale written as 1/√8), 3-d and 2-d inputs (dims counted from the front), float64 and float16.
B, H, T, S, D_K, D_V = 2, 3, 4, 6, 8, 5
T_CAUSAL = 7  # self-attention, T = S, still unlike every other size

# Not symmetric, not causal, and every row keeps at least one key and blocks at least one,
# so the inverted mask is also a mask with no empty row.
_KEEP = torch.tensor(
    [[1, 0, 1, 1, 0, 0],
     [0, 1, 1, 0, 1, 0],
     [1, 1, 0, 0, 0, 1],
     [0, 0, 1, 1, 1, 1]],
    dtype=torch.bool,
)  # fmt: skip

_BATCHED = (
    "The first probes are batched, (B, h, T, d_k): swap the last two dims of k with k.transpose(-2, -1) "
    "(k.T reverses all of them), and let the mask broadcast."
)


def attend(q, k, v, keep=None, *, scale=None, dim=-1, fill=-math.inf, after=False, added=False):
    """softmax(q kᵀ · scale) v in float64, with knobs that reproduce known mistakes.

    Returns (out, weights). ``keep`` is a keep-mask; ``fill`` is what blocked
    scores become; ``after`` applies the mask to the weights instead; ``added``
    adds the mask's 0s and 1s to the scores (the float-mask trap).
    """
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)) if scale is None else scale)
    if keep is not None and added:
        scores = scores + keep.double()
    elif keep is not None and not after:
        scores = scores.masked_fill(~keep, fill)
    weights = torch.softmax(scores, dim=dim)
    if keep is not None and after:
        weights = weights * keep
    return weights @ v, weights


def _irregular(n_q: int, n_k: int, g: torch.Generator) -> torch.Tensor:
    """A random (n_q, n_k) keep-mask in which every row keeps at least one key and blocks at least one."""
    keep = torch.rand(n_q, n_k, generator=g) < 0.5
    for row in keep:
        kept, blocked = torch.randperm(n_k, generator=g)[:2].tolist()
        row[kept], row[blocked] = True, False
    return keep


def _probes():
    """(q, k, v, keep, words for the message, the hint if the learner's code raises)."""
    g = torch.Generator().manual_seed(0)

    def qkv(lead, n_q, n_k, d_k, d_v, dtype=torch.float32):
        return tuple(torch.randn(*lead, n, d, generator=g).to(dtype) for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))

    def words(q, k, v, dtype=torch.float32):
        sizes = f"for q {shape(*q.shape)}, k {shape(*k.shape)}, v {shape(*v.shape)}"
        return sizes + (f" in {dtype}" if dtype != torch.float32 else "")

    q, k, v = qkv((B, H), T, S, D_K, D_V)
    yield q, k, v, None, f"{words(q, k, v)} and no mask", _BATCHED
    yield q, k, v, _KEEP, f"{words(q, k, v)} and a {shape(T, S)} keep-mask (True = may attend)", _BATCHED
    q, k, v = qkv((B, H), T_CAUSAL, T_CAUSAL, D_K, D_V)
    causal = torch.ones(T_CAUSAL, T_CAUSAL, dtype=torch.bool).tril()
    yield q, k, v, causal, f"{words(q, k, v)} and a causal keep-mask", _BATCHED
    later = (((3,), (5, 9, 16, 3), torch.float32), ((), (6, 4, 12, 7), torch.float64),
             ((2, 2), (3, 5, 4, 6), torch.float16))  # (leading dims, (T, S, d_k, d_v), dtype)
    for lead, (n_q, n_k, d_k, d_v), dtype in later:
        q, k, v = qkv(lead, n_q, n_k, d_k, d_v, dtype)
        keep = _irregular(n_q, n_k, g)
        yield q, k, v, keep, f"{words(q, k, v, dtype)} and a {shape(n_q, n_k)} keep-mask", _later_hint(q)


def _later_hint(q):
    """What to add when the learner's code raises on a probe that is not (B, h, T, d_k) float32."""

    def hint(error: str) -> str:
        if "overflow" in error:
            return say("fill overflows", dtype=q.dtype)
        if q.dtype != torch.float32 and ("Half" in error or "Double" in error or "dtype" in error):
            return say("dtype mix", dtype=q.dtype)
        return say("fixed dims", n=q.dim()) if q.dim() != 4 else ""

    return hint


@checker("attention", "fn(q, k, v, mask=None) -> (out, weights)")
def check_attention(fn) -> str:
    """Check ``fn(q, k, v, mask=None) -> (out, weights)``: softmax(q kᵀ / √d_k) v.

    Shapes: q (..., T, d_k), k (..., S, d_k), v (..., S, d_v) -> out
    (..., T, d_v), weights (..., T, S). ``mask`` is a bool keep-mask (T, S):
    True = this query may attend to this key. Probes CPU tensors: float32
    (B, h, T, d_k) with B=2, h=3, T=4, S=6, d_k=8, d_v=5, without a mask and
    with an irregular (4, 6) mask, and with a causal (7, 7) one; then a
    (3, 5, 16) float32 q, a (6, 12) float64 q and a (2, 2, 3, 4) float16 q,
    each with an irregular mask. No probe blocks a whole row. out and weights
    must keep q's dtype.

    Names the mistakes "scale" (anything but 1/√d_k, including a d_k written
    into the code), "softmax" (over the wrong dim), "inverted" (True read as
    blocked), "float mask" (the 0/1 mask added to the scores, which blocks
    nothing) and "value" (K where V belongs); also recognises a mask that is
    ignored, applied after the softmax, or filled with 0 instead of -inf, a
    fill value that overflows float16, dims counted from the front, a
    result cast to another dtype, and inputs changed in place.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not done yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for q, k, v, keep, probe, hint in _probes():
        args = (q.clone(), k.clone(), v.clone()) + (() if keep is None else (keep.clone(),))
        result = call(fn, *args, what="your attention", probe=probe, hint=hint)
        changed = [name for name, given, kept in zip(("q", "k", "v", "the mask"), args, (q, k, v, keep))
                   if not torch.equal(given, kept)]
        if changed:
            raise Mistake(say("inputs changed in place", names=" and ".join(changed)), probe=probe)
        out, weights = expect_pair(result, "attention", "(out, weights)", probe, dtype=q.dtype)
        right_out, right_w = attend(q, k, v, keep)
        if right_out.shape != right_w.shape and out.shape == right_w.shape and weights.shape == right_out.shape:
            raise Mistake(say("pair swapped"), probe=probe)
        _check_weights(weights, right_w, q, k, v, keep, probe)
        if matches(out, right_out):
            continue
        if matches(out, right_w @ k.double()):
            raise Mistake(say("value"), "value", probe=probe)
        raise Mistake(difference(out, right_out, "out"), probe=probe)
    return ("out and weights match softmax(q kᵀ/√d_k) v on 6 probes: (B, h, T, d_k), (B, T, d_k) and (T, d_k) inputs "
            "in float32, float64 and float16, without a mask, with irregular and with causal keep-masks.")


def _check_weights(weights, right, q, k, v, keep, probe):
    if matches(weights, right):
        return
    if weights.dim() > right.dim() and weights.shape[weights.dim() - right.dim():] == right.shape:
        raise Mistake(say("extra dims", what="weights", got=shape(*weights.shape), want=shape(*q.shape)),
                      probe=probe)
    if tuple(weights.shape) == (*right.shape[:-2], right.size(-1), right.size(-2)):
        raise Mistake(say("weights transposed", got=shape(*weights.shape), want=shape(*right.shape)), probe=probe)
    if weights.shape == right.shape and q.dim() == 4:
        for dim, over in SOFTMAX_OVER.items():
            if matches(weights, attend(q, k, v, keep, dim=dim)[1]):
                raise Mistake(say("softmax", over=over), "softmax", probe=probe)
    if keep is not None:
        if matches(weights, attend(q, k, v, ~keep)[1]):
            raise Mistake(say("inverted"), "inverted", probe=probe)
        if matches(weights, attend(q, k, v, keep, added=True)[1]):
            raise Mistake(say("float mask added", mask="0/1 keep-mask"), "float mask", probe=probe)
        for key, variant in (("mask ignored", {"keep": None}), ("mask after softmax", {"after": True}),
                             ("mask filled with 0", {"fill": 0.0})):
            if matches(weights, attend(q, k, v, **{"keep": keep, **variant})[1]):
                raise Mistake(say(key), probe=probe)
    scores = q.double() @ k.double().transpose(-2, -1)
    c = fit_scale(weights, scores, keep)
    d_k = q.size(-1)
    if c is not None and not math.isclose(c, 1 / math.sqrt(d_k), rel_tol=1e-2):
        names = scale_names(d_k=d_k, d_v=v.size(-1), n_q=q.size(-2), n_k=k.size(-2),
                            heads=q.size(1) if q.dim() == 4 else None)
        why = ", so that the scores keep a variance near 1 whatever the width"
        raise Mistake(wrong_scale(c, d_k, names, why), "scale", probe=probe)
    raise Mistake(difference(weights, right, "weights"), probe=probe)
