"""Checker for a multi-head attention module with the article's interface."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._core import Mistake, Misuse, call, checker, difference, expect_pair, matches, shape
from .mistakes import SOFTMAX_OVER, fit_scale, say, scale_names, wrong_scale

# (B, T, d_model, h, dtype): in the first probe B, T, h and d_k = 4 all differ, so each wrong reshape gives its own
# answer; the second catches an h or a width written into the code, the third h = 1 (and d_k = d_model), the fourth
# a size fixed in __init__ (a mask buffer for short sequences), the fifth code that casts to float32.
_CONFIGS = [
    (2, 5, 12, 3, torch.float32),
    (1, 3, 10, 2, torch.float32),
    (3, 9, 8, 1, torch.float32),
    (1, 40, 16, 4, torch.float32),
    (2, 6, 24, 6, torch.float64),
]


def _params(B: int, T: int, d_model: int, seed: int):
    """x, and weights and biases for qkv (rows [W_Q; W_K; W_V]) and out, from a generator of their own."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(3 * d_model, d_model, generator=g) / math.sqrt(d_model)
    b = torch.randn(3 * d_model, generator=g) / 10
    W_O = torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model)
    b_O = torch.randn(d_model, generator=g) / 10
    x = torch.randn(B, T, d_model, generator=g)
    return x, W, b, W_O, b_O


def reference(x, W, b, W_O, b_O, h, *, causal=True, split="transpose", scale=None, dim=-1, mask="keep",
              values="v", merge="transpose", w_o="linear", sees="all"):
    """The article's layer in float64, with knobs that reproduce the known mistakes. Returns (y, w).

    split: "transpose" (right), "reshape" (no transpose) or "interleaved" (qkv's output read head by head,
    [q_0, k_0, v_0, q_1, ...]); merge: "transpose" (right), "reshape", "sum" or "mean" (the heads added up,
    repeated h times so that the shapes fit); w_o: "linear" (right), "none" or "transposed" (x @ out.weight).
    """
    x, W, b, W_O, b_O = (t.double() for t in (x, W, b, W_O, b_O))
    B, T, D = x.shape
    d_k = D // h
    if sees == "slice":  # head i's projections read only columns i*d_k .. (i+1)*d_k - 1 of x
        head = torch.arange(D) // d_k
        W = W * (head.repeat(3)[:, None] == head[None, :])
    qkv = x @ W.T + b  # (B, T, 3D)
    if split == "interleaved":
        q, k, v = (t.transpose(1, 2) for t in qkv.view(B, T, h, 3, d_k).unbind(3))  # each (B, h, T, d_k)
    else:
        q, k, v = (t.view(B, T, h, d_k).transpose(1, 2) if split == "transpose" else t.reshape(B, h, T, d_k)
                   for t in qkv.split(D, dim=-1))
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d_k) if scale is None else scale)  # (B, h, T, T)
    tril = torch.ones(T, T, dtype=torch.bool).tril()
    keep = {"keep": tril, "inverted": ~tril, "inverted-diagonal": tril.T, "added": tril}[mask] if causal else None
    if mask == "added" and keep is not None:  # the float-mask trap: the 0/1 mask added to the scores
        scores = scores + keep.double()
    elif keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    w = torch.softmax(scores, dim=dim)
    out = w @ (v if values == "v" else k)  # (B, h, T, d_k)
    if merge in ("sum", "mean"):
        merged = getattr(out, merge)(dim=1).repeat(1, 1, h)  # (B, T, d_k), repeated h times
    else:
        merged = out.transpose(1, 2).reshape(B, T, D) if merge == "transpose" else out.reshape(B, T, D)
    y = {"linear": lambda: merged @ W_O.T + b_O, "none": lambda: merged, "transposed": lambda: merged @ W_O + b_O}
    return y[w_o](), w


@checker("MultiHeadAttention", "cls(d_model, h)")
def check_multi_head_attention(cls) -> str:
    """Check a multi-head attention class with the article's interface.

    ``cls(d_model, h)`` must build an ``nn.Module`` with ``qkv``
    (``nn.Linear(d_model, 3*d_model)``, weight rows [W_Q; W_K; W_V]) and
    ``out`` (W_O, ``nn.Linear(d_model, d_model)``), whose
    ``forward(x, causal=True)`` returns ``(y, w)``: x and y (B, T, d_model),
    w the per-head weights (B, h, T, T). The checker builds it for
    (d_model, h) = (12, 3), (10, 2), (8, 1), (16, 4) with T = 40, and (24, 6)
    in float64, puts its own weights into ``qkv`` and ``out`` (biases too, if
    there are any), switches it to eval mode and calls it on CPU inputs with
    causal=True, causal=False and the default. y and w must keep x's dtype.

    Names the mistakes "transpose", "scale", "softmax", "inverted", "value",
    "slice", "W_O", "concat", "causal" and "float mask" (see
    ``mha.exercises.MISTAKES``);
    also explains another layout of qkv's rows (head by head) or of W_O (used
    as stored), separate q/k/v layers, averaged or squeezed weights, a size
    fixed in ``__init__`` and a result cast to float32.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError (in
        ``__init__`` or ``forward``) gives ``passed=False`` and "not done yet".

    Raises:
        TypeError: ``cls`` is not callable, or is a module instance rather
            than its class. The learner's code never makes it raise.
    """
    if isinstance(cls, nn.Module):
        raise Misuse(
            f"check_multi_head_attention needs the class, not an instance: pass {type(cls).__name__}, "
            f"not {type(cls).__name__}(d_model, h)"
        )
    for seed, config in enumerate(_CONFIGS):
        _check_config(cls, seed, *config)
    return ("y and the per-head weights match nn.MultiheadAttention's maths for (d_model, h) = (12, 3), (10, 2), "
            "(8, 1), (16, 4) at T = 40 and (24, 6) in float64, with causal=True, causal=False and the default.")


def _check_config(cls, seed, B, T, d_model, h, dtype):
    d_k = d_model // h
    built = f"for cls(d_model={d_model}, h={h})"
    m = call(cls, d_model, h, what=f"cls({d_model}, {h})", probe="")
    if not isinstance(m, nn.Module):
        raise Mistake(f"returned a {type(m).__name__}; it should build an nn.Module.", probe=built)
    qkv, out = _linear(m, "qkv"), _linear(m, "out")
    if qkv is None:
        found = [name for name, child in m.named_children() if isinstance(getattr(child, "weight", None), torch.Tensor)]
        raise Mistake(say("no qkv", found=f" (it has {', '.join(found)})" if found else ""), probe=built)
    if tuple(qkv.weight.shape) == (3 * d_k, d_k) and h > 1:
        raise Mistake(say("slice layer", d_k=d_k), "slice", probe=built)
    if tuple(qkv.weight.shape) != (3 * d_model, d_model):
        raise Mistake(f"qkv.weight has shape {shape(*qkv.weight.shape)}; nn.Linear(d_model, 3 * d_model) "
                      f"has {shape(3 * d_model, d_model)}.", probe=built)
    if out is None:
        raise Mistake(say("no W_O"), "W_O", probe=built)
    if tuple(out.weight.shape) == (d_model, d_k) and h > 1:
        raise Mistake(say("out too narrow", d_k=d_k, d_model=d_model), "concat", probe=built)
    if tuple(out.weight.shape) != (d_model, d_model):
        raise Mistake(f"out.weight has shape {shape(*out.weight.shape)}; W_O = nn.Linear(d_model, d_model) "
                      f"has {shape(d_model, d_model)}.", probe=built)

    x, W, b, W_O, b_O = _params(B, T, d_model, seed)
    if dtype != torch.float32:
        m = call(m.to, dtype, what=f"module.to({dtype})", probe=built)
    dtype = qkv.weight.dtype  # the learner may have built the module in another dtype
    with torch.no_grad():
        for layer, weight, bias in ((qkv, W, b), (out, W_O, b_O)):
            layer.weight.copy_(weight)
            if getattr(layer, "bias", None) is not None:
                layer.bias.copy_(bias)
            else:
                bias.zero_()  # the reference then has no bias either
    m.eval()
    x = x.to(dtype)
    params = (x, W, b, W_O, b_O)
    probe = f"for x of shape {shape(B, T, d_model)}" + (f" in {dtype}" if dtype != torch.float32 else "")
    probe += f", d_model={d_model}, h={h}"
    if seed and T > max(c[1] for c in _CONFIGS[:seed]):
        hint = say("fixed length")
    elif dtype != torch.float32:
        hint = say("dtype mix", dtype=dtype)
    else:
        hint = say("later probe") if seed else ""

    y, w = _forward(m, x, h, f"{probe}, causal=True", hint, causal=True)
    _check_causal(y, w, params, h, f"{probe}, causal=True", m)
    y_free, w_free = _forward(m, x, h, f"{probe}, causal=False", hint, causal=False)
    right_y, right_w = reference(*params, h, causal=False)
    if not matches(w_free, right_w):
        if matches(w_free, w):
            raise Mistake(say("causal stuck"), probe=f"{probe}, causal=False")
        raise Mistake(difference(w_free, right_w, "w"), probe=f"{probe}, causal=False")
    if not matches(y_free, right_y):
        raise Mistake(difference(y_free, right_y, "y"), probe=f"{probe}, causal=False")
    y_default, _ = _forward(m, x, h, f"{probe}, called as forward(x)", hint)
    if not matches(y_default, y):
        raise Mistake("forward(x) differs from forward(x, causal=True): causal should default to True.", probe=probe)


def _linear(m, name):
    layer = getattr(m, name, None)
    return layer if isinstance(getattr(layer, "weight", None), torch.Tensor) else None


def _forward(m, x, h, probe, hint="", **kwargs):
    result = call(m, x.clone(), what="forward", probe=probe, hint=hint, **kwargs)
    y, w = expect_pair(result, "forward", "(y, w)", probe, dtype=x.dtype)
    B, T, D = x.shape
    if y.shape != x.shape:
        if y.dim() < 3 and y.numel() == x.numel():
            raise Mistake(say("squeeze", what="y", got=shape(*y.shape), dims="B is", want="B, T, d_model"), probe=probe)
        raise Mistake(f"y has shape {shape(*y.shape)}; it should have x's shape {shape(B, T, D)}, "
                      "so that layers stack.", probe=probe)
    if w.dim() < 4 and w.numel() == B * h * T * T:
        ones = [n for n, size in (("B", B), ("h", h)) if size == 1]
        dims = " and ".join(ones) + (" are" if len(ones) > 1 else " is")
        raise Mistake(say("squeeze", what="w", got=shape(*w.shape), dims=dims, want="B, h, T, T"), probe=probe)
    if w.dim() == 3 and w.shape == (B, T, T):
        raise Mistake(say("averaged weights", got=shape(*w.shape)), probe=probe)
    return y, w


def _check_causal(y, w, params, h, probe, m):
    d_k = params[0].size(-1) // h
    right_y, right_w = reference(*params, h)
    if not matches(w, right_w):
        _diagnose_weights(w, right_w, params, h, d_k, probe, m)
    if matches(y, right_y):
        return
    for knobs, key, word in (({"w_o": "none"}, "W_O unused", "W_O"), ({"w_o": "transposed"}, "W_O transposed", None),
                             ({"merge": "reshape"}, "merge without transpose", "transpose"),
                             ({"values": "k"}, "value", "value")):
        if matches(y, reference(*params, h, **knobs)[0]):
            raise Mistake(("the weights are right, but " if word == "transpose" else "") + say(key), word, probe=probe)
    for how in ("sum", "mean"):
        if h > 1 and matches(y, reference(*params, h, merge=how)[0]):
            sizes = f" = (B, T, {params[0].size(-1)}), before W_O"
            raise Mistake(say("heads summed", how="sum" if how == "sum" else "average", sizes=sizes), "concat",
                          probe=probe)
    raise Mistake(difference(y, right_y, "y"), probe=probe)


def _diagnose_weights(w, right_w, params, h, d_k, probe, m):
    if w.shape != right_w.shape:
        raise Mistake(difference(w, right_w, "w"), probe=probe)
    if matches(w, reference(*params, h, causal=False)[1]):
        raise Mistake(say("causal"), "causal", probe=probe)
    if any(matches(w, reference(*params, h, mask=mask)[1]) for mask in ("inverted", "inverted-diagonal")):
        raise Mistake(say("inverted causal"), "inverted", probe=probe)
    if matches(w, reference(*params, h, mask="added")[1]):
        raise Mistake(say("float mask added", mask="causal 0/1 mask, torch.tril(torch.ones(T, T)),"), "float mask",
                      probe=probe)
    if matches(w, reference(*params, h, split="reshape")[1]):
        raise Mistake(say("split without transpose", sizes=""), "transpose", probe=probe)
    if matches(w, reference(*params, h, split="interleaved")[1]):
        raise Mistake(say("interleaved qkv"), probe=probe)
    for dim, over in SOFTMAX_OVER.items():
        if matches(w, reference(*params, h, dim=dim)[1]):
            raise Mistake(say("softmax", over=over), "softmax", probe=probe)
    if matches(w, reference(*params, h, sees="slice")[1]) or _blind_to_other_slices(m, params, h, d_k, w):
        raise Mistake(say("slice"), "slice", probe=probe)
    x, W, b, _, _ = params
    q, k, _ = (x.double() @ W.double().T + b.double()).split(x.size(-1), dim=-1)
    B, T, D = x.shape
    q, k = (t.view(B, T, h, d_k).transpose(1, 2) for t in (q, k))
    c = fit_scale(w, q @ k.transpose(-2, -1), torch.ones(T, T, dtype=torch.bool).tril())
    if c is not None and not math.isclose(c, 1 / math.sqrt(d_k), rel_tol=1e-2):
        names = scale_names(d_k=d_k, d_model=D)
        why = ", and d_k = d_model / h: each head's dot products have d_k terms"
        raise Mistake(wrong_scale(c, d_k, names, why), "scale", probe=probe)
    raise Mistake(difference(w, right_w, "w"), probe=probe)


def _blind_to_other_slices(m, params, h, d_k, w):
    """True when changing only head 0's slice of x leaves every other head's weights exactly as they were."""
    if h < 2:
        return False
    x = params[0].clone()
    x[..., :d_k] += 1.0
    try:
        _, w_changed = _forward(m, x, h, "")
    except Mistake:
        return False
    return w_changed.shape == w.shape and torch.equal(w_changed[:, 1:], w[:, 1:]) and not torch.equal(w_changed, w)
