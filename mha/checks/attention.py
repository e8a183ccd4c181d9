"""Checks of ``mha.heads`` and ``mha.scaled_dot_product_attention``."""

from __future__ import annotations

import torch

from ..precision import autocast_dtype, autocast_inputs
from .masks import fits, keep_mask
from .values import broadcast, check_positive, dropout, flags, scale, tensor


def split_heads(x, h) -> None:
    if type(h) is not int or h <= 0:
        check_positive(h=h)
    if not isinstance(x, torch.Tensor):
        tensor("x", x)
    if x.dim() != 3 or x.size(-1) % h:
        raise ValueError(f"split_heads needs (B, T, h*d_k) with h={h}, got shape {tuple(x.shape)}")


def merge_heads(x) -> None:
    if not isinstance(x, torch.Tensor):
        tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"merge_heads needs (B, h, T, d_k), got shape {tuple(x.shape)}")


# -- scaled_dot_product_attention -----------------------------------------------------------------------


def attention_inputs(q, k, v, mask, is_causal, scale_, dropout_p, need_weights, enable_gqa):
    """``mha.scaled_dot_product_attention``'s inputs, checked: (q, k, v, keep).

    Under an active autocast q, k and v come back in its dtype (as its matmuls would cast
    them), and the mask as a bool keep-mask on q's device, or None.
    """
    passed = [getattr(t, "dtype", None) for t in (q, k, v)]  # as given: the message names these, not autocast's
    q, k, v = autocast_inputs(q, k, v)  # a no-op outside torch.autocast
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must be at least 2-D (..., length, dim), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        active = autocast_dtype(q.device.type)
        advice = "cast them to one, or run under torch.autocast for mixed precision"
        if active is not None:  # it cast the others to its dtype; it never casts float64
            advice = f"torch.autocast casts the others to {active} but never float64: cast those to float32"
        raise TypeError(f"q, k, v must share a dtype, got {', '.join(map(str, passed))}; {advice}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.size(-1) == 0:
        raise ValueError(f"d_k must be positive, got q of shape {tuple(q.shape)}")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k need the same last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v need the same length S (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    flags(is_causal=is_causal, need_weights=need_weights, enable_gqa=enable_gqa)
    batch = _attention_batch(q, k, v, enable_gqa)
    scale(scale_)
    dropout(dropout_p)
    if mask is None:
        return q, k, v, None
    keep = keep_mask(mask, device=q.device)
    fits(keep, (*batch, q.size(-2), k.size(-2)), "(..., T, S) =")
    return q, k, v, keep


def _attention_batch(q, k, v, enable_gqa):
    """The leading dims of the scores (..., T, S), checked to broadcast (with enable_gqa, q's heads included)."""
    if enable_gqa:
        if q.dim() < 3 or k.dim() < 3 or k.shape != v.shape[:-1] + k.shape[-1:]:
            raise ValueError(
                f"enable_gqa needs q (..., h, T, d_k) and k, v (..., g, S, d), got "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        if k.size(-3) == 0 or q.size(-3) % k.size(-3):
            raise ValueError(f"enable_gqa needs the K/V heads g={k.size(-3)} to divide the query heads h={q.size(-3)}")
        batch_dims = (q.shape[:-3], k.shape[:-3])
    else:
        batch_dims = (q.shape[:-2], k.shape[:-2], v.shape[:-2])
    batch = broadcast(*batch_dims)
    if batch is None:
        raise ValueError(
            f"leading dims of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not broadcast"
            + ("" if enable_gqa else " (for fewer K/V heads than query heads pass enable_gqa=True)")
        )
    return (*batch, q.size(-3)) if enable_gqa else tuple(batch)
