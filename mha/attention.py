"""Scaled dot-product attention, the operation every head runs (Part 5).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V      (Vaswani et al. 2017, §3.2.1)

Two paths give the same numbers: the explicit path builds the (T, S) table of weights, so that you can look at
it; the fused path (``need_weights=False``) hands the work to ``torch.nn.functional.scaled_dot_product_attention``,
which picks a flash or memory-efficient kernel and never builds that table.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from .masks import as_keep_mask, causal_mask


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * scale) v: q (..., T, d_k), k (..., S, d_k), v (..., S, d_v) -> out (..., T, d_v) and the
    weights (..., T, S), or None with ``need_weights=False`` (the fused path). Leading dims ``...`` broadcast.

    Args:
        q, k, v: floating tensors of one dtype, on one device.
        mask: a keep-mask (True or 1 = may attend, False or 0 = blocked) that broadcasts to (..., T, S).
        is_causal: query i attends to keys up to i, aligned bottom-right (with T < S the queries are the last T
            positions, as when decoding against cached keys); with ``mask``, a key must be allowed by both.
        scale: multiplies the scores; default 1 / sqrt(d_k).
        dropout_p: the probability of zeroing a weight, applied whenever it is > 0.

    A query whose keys are all blocked gets zero weights and a zero output, never NaN, and keys that the mask
    blocks for every query never reach the output, even when they hold inf or NaN (cases C4, C14). Half precision
    computes scores and softmax in float32 on the explicit path. The fused path's derivatives are PyTorch's: for
    second derivatives use ``need_weights=True`` (the compatibility page).

    Raises:
        TypeError: an input is not a floating tensor, the dtypes differ, a flag is not a bool, scale not a number.
        ValueError: shapes do not fit together (names them), the mask does not broadcast or is not 0/1, scale is
            not finite, dropout_p is outside [0, 1).

    See PyTorch's ``F.scaled_dot_product_attention``: its bool masks mean the same, its float masks are added to
    the scores, and its ``is_causal`` aligns top-left.
    """
    batch = _check_qkv(q, k, v)
    check_flag("is_causal", is_causal)
    check_flag("need_weights", need_weights)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a number (default None: 1 / sqrt(d_k)), got {type(scale).__name__} {scale!r}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}: every score would be inf or NaN")
    check_dropout(dropout_p, "dropout_p")
    keep = None
    if mask is not None:
        keep = as_keep_mask(mask, q.device)
        if not fits(keep.shape, (*batch, q.size(-2), k.size(-2))):
            raise ValueError(f"mask of shape {tuple(keep.shape)} does not broadcast to (..., T, S) = "
                             f"{(*batch, q.size(-2), k.size(-2))}")
    return attend(q, k, v, keep, is_causal=is_causal, scale=scale, dropout_p=dropout_p, need_weights=need_weights)


def attend(q, k, v, keep=None, *, is_causal=False, scale=None, dropout_p=0.0, need_weights=True):
    """:func:`scaled_dot_product_attention` on checked inputs, ``keep`` a bool keep-mask or None.

    ``MultiHeadAttention`` calls it after checking its own inputs: its q, k and v come from its own projections.
    """
    T, S = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    if is_causal and (need_weights or keep is not None or T != S):  # else the fused kernel does causal itself
        causal = causal_mask(T, S, device=q.device)  # (T, S), bottom-right
        keep, is_causal = (causal if keep is None else keep & causal), False
    has_key = None
    if keep is not None:
        keep = torch.atleast_2d(keep)  # (..., T, S)
        # A key no query may look at must not reach the output, not even as 0 * NaN: zero it and its value.
        seen = keep.any(dim=-2).unsqueeze(-1)  # (..., S, 1)
        k, v = torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)
        # A query with no key at all would take a softmax over only -inf, which is NaN: let it attend to every
        # key, then zero its output below. Its query is zeroed too, so that NaN there reaches no gradient.
        has_key = keep.any(dim=-1, keepdim=True)  # (..., T, 1)
        keep, q = keep | ~has_key, torch.where(has_key, q, 0.0)
    if need_weights:
        work = torch.promote_types(q.dtype, torch.float32)  # float16 and bfloat16: scores and softmax in float32
        scores = (q.to(work) @ k.to(work).transpose(-2, -1)) * scale  # (..., T, S)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        w = torch.softmax(scores, dim=-1).to(q.dtype)  # each row sums to 1
        w = F.dropout(w, p=dropout_p) if dropout_p > 0 else w
        out = w @ v  # (..., T, d_v)
    else:
        w = None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p, is_causal=is_causal,
                                             scale=scale)
    if has_key is not None:  # where, not *: 0 * NaN would be NaN
        out = torch.where(has_key, out, 0.0)
        w = None if w is None else torch.where(has_key, w, 0.0)
    return out, w


# -- the checks that the function and the layer share ----------------------------------------------------------


def _check_qkv(q, k, v) -> tuple[int, ...]:
    """q, k and v checked to fit together; returns the leading dims of the scores (..., T, S)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a floating tensor, got {got}")
        if t.dim() < 2:
            raise ValueError(f"{name} must be at least 2-D (..., length, dim), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.size(-1) == 0 or q.size(-1) != k.size(-1):
        raise ValueError(f"q and k need the same positive last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v need the same length S (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    try:
        return tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    except RuntimeError:
        raise ValueError(f"the leading dims of q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} do not "
                         "broadcast") from None


def fits(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without growing it (a mask against the scores' shape)."""
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


def check_flag(name: str, value) -> None:
    """Raise TypeError unless ``value`` is a Python bool (a mask passed as is_causal, say)."""
    if not isinstance(value, bool):
        kind = type(value)  # qualified outside builtins: NumPy 2 calls np.bool_ "bool"
        kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(f"{name} must be True or False (a Python bool), got {kind}")


def check_dropout(p, name: str = "dropout") -> None:
    """Raise unless ``p`` is a real number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a number in [0, 1), got {p!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
