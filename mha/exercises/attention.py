"""Checker for scaled dot-product attention with a keep-mask."""

from __future__ import annotations

import math

import torch

from ._core import Mistake, call, checker, difference, expect_pair, fit_scale, matches, name_scale, shape

# Every size differs (B=2, h=3, T=4, S=6, d_k=8, d_v=5), so a wrong scale, a softmax over
# the wrong dim and K used as V each give a different answer, and T != S shows which
# side of the (T, S) table a mask or a softmax was applied to.
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
    "The probes are batched, (B, h, T, d_k): swap the last two dims of k with k.transpose(-2, -1) "
    "(k.T reverses all of them), and let the mask broadcast."
)

_SOFTMAX_DIMS = {0: "the batch (dim 0)", 1: "the heads (dim 1)", 2: "the queries (dim -2)"}


def attend(q, k, v, keep=None, *, scale=None, dim=-1, fill=-math.inf, after=False):
    """softmax(q kᵀ · scale) v in float64, with knobs that reproduce known mistakes.

    Returns (out, weights). ``keep`` is a keep-mask; ``fill`` is what blocked
    scores become; ``after`` applies the mask to the weights instead.
    """
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)) if scale is None else scale)
    if keep is not None and not after:
        scores = scores.masked_fill(~keep, fill)
    weights = torch.softmax(scores, dim=dim)
    if keep is not None and after:
        weights = weights * keep
    return weights @ v, weights


def _probes():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, d, generator=g) for n, d in ((T, D_K), (S, D_K), (S, D_V)))
    dims = f"for q {shape(B, H, T, D_K)}, k {shape(B, H, S, D_K)}, v {shape(B, H, S, D_V)}"
    yield q, k, v, None, f"{dims} and no mask"
    yield q, k, v, _KEEP, f"{dims} and a {shape(T, S)} keep-mask (True = may attend)"
    q, k, v = (torch.randn(B, H, T_CAUSAL, d, generator=g) for d in (D_K, D_K, D_V))
    causal = torch.ones(T_CAUSAL, T_CAUSAL, dtype=torch.bool).tril()
    dims = f"for q {shape(B, H, T_CAUSAL, D_K)}, k {shape(B, H, T_CAUSAL, D_K)}, v {shape(B, H, T_CAUSAL, D_V)}"
    yield q, k, v, causal, f"{dims} and a causal (tril) keep-mask"


@checker("attention", "fn(q, k, v, mask=None) -> (out, weights)")
def check_attention(fn) -> str:
    """Check ``fn(q, k, v, mask=None) -> (out, weights)``: softmax(q kᵀ / √d_k) v.

    Shapes: q (B, h, T, d_k), k (B, h, S, d_k), v (B, h, S, d_v) -> out
    (B, h, T, d_v), weights (B, h, T, S). ``mask`` is a bool keep-mask (T, S):
    True = this query may attend to this key. Probes float32 CPU tensors with
    B=2, h=3, T=4, S=6, d_k=8, d_v=5, without a mask, with an irregular
    (4, 6) mask, and with a causal (7, 7) one (T = S = 7); no probe blocks a
    whole row.

    Names the mistakes "scale" (anything but 1/√d_k), "softmax" (over the
    wrong dim), "inverted" (True read as blocked) and "value" (K where V
    belongs); also recognises a mask that is ignored, applied after the
    softmax, or filled with 0 instead of -inf.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not implemented yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for q, k, v, keep, probe in _probes():
        args = (q.clone(), k.clone(), v.clone()) + (() if keep is None else (keep.clone(),))
        result = call(fn, *args, what="your attention", probe=probe, hint=_BATCHED)
        out, weights = expect_pair(result, "attention", "(out, weights)", probe)
        right_out, right_w = attend(q, k, v, keep)
        if right_out.shape != right_w.shape and out.shape == right_w.shape and weights.shape == right_out.shape:
            raise Mistake("you return (weights, out); return them the other way round, (out, weights).", probe=probe)
        _check_weights(weights, right_w, q, k, v, keep, probe)
        if matches(out, right_out):
            continue
        if matches(out, right_w @ k.double()):
            raise Mistake(
                f"the weights are right but the output is weights @ K: the weights must average the "
                f"value vectors, weights @ V (value), giving {shape(*right_out.shape)}.",
                "value", probe=probe,
            )
        raise Mistake(difference(out, right_out, "out"), probe=probe)
    return "out and weights match softmax(q kᵀ/√d_k) v without a mask, with an irregular and with a causal keep-mask."


def _check_weights(weights, right, q, k, v, keep, probe):
    if matches(weights, right):
        return
    if tuple(weights.shape) == (*right.shape[:-2], right.size(-1), right.size(-2)):
        raise Mistake(
            f"weights have shape {shape(*weights.shape)}, keys by queries. One row per query: "
            f"scores = q @ k.transpose(-2, -1), shape {shape(*right.shape)}.", probe=probe
        )
    if weights.shape == right.shape:
        for dim, name in _SOFTMAX_DIMS.items():
            if matches(weights, attend(q, k, v, keep, dim=dim)[1]):
                raise Mistake(
                    f"your softmax normalises over {name}, so the weights of one query do not sum to 1. "
                    "Each query's weights are a distribution over the keys: softmax(scores, dim=-1).",
                    "softmax", probe=probe,
                )
    if keep is not None:
        if matches(weights, attend(q, k, v, ~keep)[1]):
            raise Mistake(
                "the mask is inverted: your weights are zero exactly where the mask is True. In this "
                "library True means 'may attend', so block the keys where the mask is False: "
                "scores.masked_fill(~mask, float('-inf')).",
                "inverted", probe=probe,
            )
        if matches(weights, attend(q, k, v)[1]):
            raise Mistake("the mask changes nothing: blocked keys still get weight. Set their scores "
                          "to -inf before the softmax.", probe=probe)
        if matches(weights, attend(q, k, v, keep, after=True)[1]):
            raise Mistake("you zero the blocked weights after the softmax, so the rows no longer sum "
                          "to 1. Mask the scores (-inf) before the softmax instead.", probe=probe)
        if matches(weights, attend(q, k, v, keep, fill=0.0)[1]):
            raise Mistake("blocked scores are set to 0, and exp(0) is not 0, so blocked keys still "
                          "get weight. Fill them with float('-inf').", probe=probe)
    scores = q.double() @ k.double().transpose(-2, -1)
    c = fit_scale(weights, scores, keep)
    if c is not None and not math.isclose(c, 1 / math.sqrt(q.size(-1)), rel_tol=1e-2):
        d_k, d_v, n_q, n_k = q.size(-1), v.size(-1), q.size(-2), k.size(-2)
        names = {
            "no scaling": 1.0,
            "1/d_k": 1 / d_k,
            "√d_k: multiplied instead of divided": math.sqrt(d_k),
            "d_k ** -1 / 2, which is (1/d_k) / 2": 1 / (2 * d_k),
            "1/√d_v": 1 / math.sqrt(d_v),
            "1/√T": 1 / math.sqrt(n_q),
            "1/√S": 1 / math.sqrt(n_k),
            "1/√(h·d_k)": 1 / math.sqrt(q.size(1) * d_k),
        }
        raise Mistake(
            f"your weights are softmax(c · q kᵀ) with the scale c = {name_scale(c, names)}. "
            f"The scale must be 1/√d_k = {1 / math.sqrt(d_k):.3g} (d_k = {d_k}), so that the scores keep a "
            "variance near 1 whatever the width.",
            "scale", probe=probe,
        )
    raise Mistake(difference(weights, right, "weights"), probe=probe)
