"""Checker for a multi-head attention module with the article's interface."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._core import Mistake, call, checker, difference, expect_pair, fit_scale, matches, name_scale, shape

# (B, T, d_model, h): in the first probe B, T, h and d_k = 4 all differ, so each wrong
# reshape gives its own answer; the second catches an h or a width written into the code.
_CONFIGS = [(2, 5, 12, 3), (1, 3, 10, 2)]


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
              values="v", merge="transpose", w_o=True, sees="all"):
    """The article's layer in float64, with knobs that reproduce the known mistakes. Returns (y, w)."""
    x, W, b, W_O, b_O = (t.double() for t in (x, W, b, W_O, b_O))
    B, T, D = x.shape
    d_k = D // h
    if sees == "slice":  # head i's projections read only columns i*d_k .. (i+1)*d_k - 1 of x
        head = torch.arange(D) // d_k
        W = W * (head.repeat(3)[:, None] == head[None, :])
    q, k, v = (x @ W.T + b).split(D, dim=-1)  # (B, T, D) each

    def heads(t):  # (B, T, D) -> (B, h, T, d_k)
        return t.view(B, T, h, d_k).transpose(1, 2) if split == "transpose" else t.reshape(B, h, T, d_k)

    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d_k) if scale is None else scale)  # (B, h, T, T)
    tril = torch.ones(T, T, dtype=torch.bool).tril()
    keep = {"keep": tril, "inverted": ~tril, "inverted-diagonal": tril.T}[mask] if causal else None
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    w = torch.softmax(scores, dim=dim)
    out = w @ (v if values == "v" else k)  # (B, h, T, d_k)
    merged = out.transpose(1, 2).reshape(B, T, D) if merge == "transpose" else out.reshape(B, T, D)
    return (merged @ W_O.T + b_O if w_o else merged), w


@checker("MultiHeadAttention", "cls(d_model, h)")
def check_multi_head_attention(cls) -> str:
    """Check a multi-head attention class with the article's interface.

    ``cls(d_model, h)`` must build an ``nn.Module`` with ``qkv``
    (``nn.Linear(d_model, 3*d_model)``, weight rows [W_Q; W_K; W_V]) and
    ``out`` (W_O, ``nn.Linear(d_model, d_model)``), whose
    ``forward(x, causal=True)`` returns ``(y, w)``: x and y (B, T, d_model),
    w the per-head weights (B, h, T, T). The checker builds it for
    (d_model, h) = (12, 3) and (10, 2), puts its own weights into ``qkv`` and
    ``out`` (biases too, if there are any), switches it to eval mode and calls
    it on float32 inputs with causal=True, causal=False and the default.

    Names the mistakes "transpose", "scale", "softmax", "inverted", "value",
    "slice", "W_O", "concat" and "causal" (see ``mha.exercises.MISTAKES``).

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError (in
        ``__init__`` or ``forward``) gives ``passed=False`` and "not implemented yet".

    Raises:
        TypeError: ``cls`` is not callable, or is a module instance rather
            than its class. The learner's code never makes it raise.
    """
    if isinstance(cls, nn.Module):
        raise TypeError(
            f"check_multi_head_attention needs the class, not an instance: pass {type(cls).__name__}, "
            f"not {type(cls).__name__}(d_model, h)"
        )
    for seed, (B, T, d_model, h) in enumerate(_CONFIGS):
        _check_config(cls, seed, B, T, d_model, h)
    return ("y and the per-head weights match nn.MultiheadAttention's maths for (d_model, h) = (12, 3) and (10, 2), "
            "with causal=True, causal=False and the default.")


def _check_config(cls, seed, B, T, d_model, h):
    d_k = d_model // h
    built = f"for cls(d_model={d_model}, h={h})"
    m = call(cls, d_model, h, what=f"cls({d_model}, {h})", probe="")
    if not isinstance(m, nn.Module):
        raise Mistake(f"returned a {type(m).__name__}; it should build an nn.Module.", probe=built)
    qkv, out = _linear(m, "qkv"), _linear(m, "out")
    if qkv is None:
        raise Mistake("the module has no `qkv` layer. The exercise's layout is one "
                      "self.qkv = nn.Linear(d_model, 3 * d_model) whose rows are [W_Q; W_K; W_V].", probe=built)
    if tuple(qkv.weight.shape) == (3 * d_k, d_k):
        raise Mistake(
            f"qkv maps d_k = {d_k} inputs, so each head projects only its own slice of the embedding "
            f"and is blind to the rest. Every head must see the whole embedding: qkv = nn.Linear(d_model, "
            "3 * d_model), split into heads after the projection.",
            "slice", probe=built,
        )
    if tuple(qkv.weight.shape) != (3 * d_model, d_model):
        raise Mistake(f"qkv.weight has shape {shape(*qkv.weight.shape)}; nn.Linear(d_model, 3 * d_model) "
                      f"has {shape(3 * d_model, d_model)}.", probe=built)
    if out is None:
        raise Mistake(
            "the module has no `out` layer: the heads are concatenated but never mixed. Add the output "
            "projection W_O, self.out = nn.Linear(d_model, d_model), and apply it to the concatenated heads.",
            "W_O", probe=built,
        )
    if tuple(out.weight.shape) == (d_model, d_k):
        raise Mistake(
            f"out maps d_k = {d_k} inputs, so the heads must be summed or averaged before it, and "
            f"what each head found is mixed away. Concatenate the heads (concat) into (B, T, h·d_k) = "
            f"(B, T, {d_model}) and give out d_model inputs.",
            "concat", probe=built,
        )
    if tuple(out.weight.shape) != (d_model, d_model):
        raise Mistake(f"out.weight has shape {shape(*out.weight.shape)}; W_O = nn.Linear(d_model, d_model) "
                      f"has {shape(d_model, d_model)}.", probe=built)

    x, W, b, W_O, b_O = _params(B, T, d_model, seed)
    with torch.no_grad():
        for layer, weight, bias in ((qkv, W, b), (out, W_O, b_O)):
            layer.weight.copy_(weight)
            if getattr(layer, "bias", None) is not None:
                layer.bias.copy_(bias)
            else:
                bias.zero_()  # the reference then has no bias either
    m.eval()
    x = x.to(qkv.weight.dtype)
    params = (x, W, b, W_O, b_O)
    probe = f"for x of shape {shape(B, T, d_model)}, d_model={d_model}, h={h}"

    y, w = _forward(m, x, f"{probe}, causal=True", causal=True)
    _check_causal(y, w, params, h, f"{probe}, causal=True", m)
    y_free, w_free = _forward(m, x, f"{probe}, causal=False", causal=False)
    right_y, right_w = reference(*params, h, causal=False)
    if not matches(w_free, right_w):
        if matches(w_free, w):
            raise Mistake("forward(x, causal=False) still applies the causal mask: with causal=False "
                          "every token may attend to every token.", probe=f"{probe}, causal=False")
        raise Mistake(difference(w_free, right_w, "w"), probe=f"{probe}, causal=False")
    if not matches(y_free, right_y):
        raise Mistake(difference(y_free, right_y, "y"), probe=f"{probe}, causal=False")
    y_default, _ = _forward(m, x, f"{probe}, called as forward(x)")
    if not matches(y_default, y):
        raise Mistake("forward(x) differs from forward(x, causal=True): causal should default to True.", probe=probe)


def _linear(m, name):
    layer = getattr(m, name, None)
    return layer if isinstance(getattr(layer, "weight", None), torch.Tensor) else None


def _forward(m, x, probe, **kwargs):
    result = call(m, x.clone(), what="forward", probe=probe, **kwargs)
    y, w = expect_pair(result, "forward", "(y, w)", probe)
    B, T, D = x.shape
    if y.shape != x.shape:
        raise Mistake(f"y has shape {shape(*y.shape)}; it should have x's shape {shape(B, T, D)}, "
                      "so that layers stack.", probe=probe)
    if w.dim() == 3 and w.shape == (B, T, T):
        raise Mistake(f"w has shape {shape(*w.shape)}: return the weights of every head, (B, h, T, T), "
                      "not their average.", probe=probe)
    return y, w


def _check_causal(y, w, params, h, probe, m):
    d_k = params[0].size(-1) // h
    right_y, right_w = reference(*params, h)
    if not matches(w, right_w):
        _diagnose_weights(w, right_w, params, h, d_k, probe, m)
    if matches(y, right_y):
        return
    if matches(y, reference(*params, h, w_o=False)[0]):
        raise Mistake(
            "the weights are right, but y is the concatenated heads as they are: the output "
            "projection W_O (self.out) is never applied. W_O is what mixes the heads' findings.",
            "W_O", probe=probe,
        )
    if matches(y, reference(*params, h, merge="reshape")[0]):
        raise Mistake(
            "the weights are right, but the heads are merged with a reshape of (B, h, T, d_k) straight "
            "to (B, T, d_model), which mixes heads with time steps. transpose(1, 2) to (B, T, h, d_k) first, "
            "then reshape.",
            "transpose", probe=probe,
        )
    if matches(y, reference(*params, h, values="k")[0]):
        raise Mistake(
            "the weights are right, but they average the keys: weights @ K. They must average the "
            "value vectors: weights @ V (value).",
            "value", probe=probe,
        )
    raise Mistake(difference(y, right_y, "y"), probe=probe)


def _diagnose_weights(w, right_w, params, h, d_k, probe, m):
    if w.shape != right_w.shape:
        raise Mistake(difference(w, right_w, "w"), probe=probe)
    if matches(w, reference(*params, h, causal=False)[1]):
        raise Mistake(
            "every token attends to later tokens too: forward(x, causal=True) must block the future "
            "(causal mask: query i sees keys 0..i).",
            "causal", probe=probe,
        )
    if any(matches(w, reference(*params, h, mask=mask)[1]) for mask in ("inverted", "inverted-diagonal")):
        raise Mistake(
            "the causal mask is inverted: each token attends to the future and not to the past. "
            "Keep the keys where torch.tril(...) is True, block the others: "
            "scores.masked_fill(~tril, float('-inf')).",
            "inverted", probe=probe,
        )
    if matches(w, reference(*params, h, split="reshape")[1]):
        raise Mistake(
            "the heads are made by reshaping (B, T, d_model) straight into (B, h, T, d_k), which cuts "
            "the sequence instead of each token's vector. view as (B, T, h, d_k), then transpose(1, 2).",
            "transpose", probe=probe,
        )
    for dim, name in {0: "the batch (dim 0)", 1: "the heads (dim 1)", 2: "the queries (dim 2)"}.items():
        if matches(w, reference(*params, h, dim=dim)[1]):
            raise Mistake(
                f"the softmax normalises over {name}. Each query's weights are a distribution over "
                "the keys: softmax(scores, dim=-1).",
                "softmax", probe=probe,
            )
    if matches(w, reference(*params, h, sees="slice")[1]) or _blind_to_other_slices(m, params, h, d_k, w):
        raise Mistake(
            "each head sees only its own d_k-wide slice of the embedding. Every head must see the whole "
            "embedding: project with qkv first (all d_model inputs), then split the projection into heads.",
            "slice", probe=probe,
        )
    x, W, b, _, _ = params
    q, k, _ = (x.double() @ W.double().T + b.double()).split(x.size(-1), dim=-1)
    B, T, D = x.shape
    q, k = (t.view(B, T, h, d_k).transpose(1, 2) for t in (q, k))
    c = fit_scale(w, q @ k.transpose(-2, -1), torch.ones(T, T, dtype=torch.bool).tril())
    if c is not None and not math.isclose(c, 1 / math.sqrt(d_k), rel_tol=1e-2):
        names = {
            "no scaling": 1.0,
            "1/d_k": 1 / d_k,
            "1/√d_model": 1 / math.sqrt(D),
            "√d_k: multiplied instead of divided": math.sqrt(d_k),
            "d_k ** -1 / 2, which is (1/d_k) / 2": 1 / (2 * d_k),
        }
        raise Mistake(
            f"your weights are softmax(c · q kᵀ) with the scale c = {name_scale(c, names)}. The scale "
            f"must be 1/√d_k = {1 / math.sqrt(d_k):.3g} (d_k = d_model / h = {d_k}): each head's dot products "
            "have d_k terms.",
            "scale", probe=probe,
        )
    raise Mistake(difference(w, right_w, "w"), probe=probe)


def _blind_to_other_slices(m, params, h, d_k, w):
    """True when changing only head 0's slice of x leaves every other head's weights exactly as they were."""
    if h < 2:
        return False
    x = params[0].clone()
    x[..., :d_k] += 1.0
    try:
        _, w_changed = _forward(m, x, "")
    except Mistake:
        return False
    return w_changed.shape == w.shape and torch.equal(w_changed[:, 1:], w[:, 1:]) and not torch.equal(w_changed, w)
