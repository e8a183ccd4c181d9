"""The reshapes that make heads, as functions: split, merge, and a layer's Q, K and V before the split.

These reshapes are the whole "multi" in multi-head attention: one wide projection is viewed as h narrow ones, and
the h outputs are laid side by side again before W_O. ``MultiHeadAttention.forward`` does them inline, as the
article does; notebooks 02 to 05 use these to look at each step.
"""

from __future__ import annotations

import numbers

import torch

from .multihead import MultiHeadAttention


def split_heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, T, h*d_k) -> (B, h, T, d_k): each head gets its own d_k-wide slice of the *projected* vector, and every
    slice was computed from the whole input embedding.

    Raises:
        TypeError: x is not a tensor, or h not an int. ValueError: x is not 3-D, its width is not a multiple of h,
            or h is not positive.
    """
    if isinstance(h, bool) or not isinstance(h, numbers.Integral):
        raise TypeError(f"h must be an int, got {h!r}")
    if h <= 0:
        raise ValueError(f"h must be positive, got {h}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.size(-1) % h:
        raise ValueError(f"split_heads needs (B, T, h*d_k) with h={h}, got shape {tuple(x.shape)}")
    B, T, _ = x.shape
    return x.view(B, T, h, x.size(-1) // h).transpose(1, 2)  # (B, T, h, d_k) -> (B, h, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h*d_k), the inverse of :func:`split_heads`.

    The order matters: move h next to d_k first, then flatten them. Reshaping (B, h, T, d_k) straight to
    (B, T, h*d_k) also runs, but mixes heads with time steps (case C6).

    Raises:
        TypeError: x is not a tensor. ValueError: x is not 4-D.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"merge_heads needs (B, h, T, d_k), got shape {tuple(x.shape)}")
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, h, d_k) -> (B, T, h*d_k)


def project(layer, x: torch.Tensor, context: torch.Tensor | None = None):
    """A layer's Q from x and K, V from ``context`` (or x), all heads side by side, not yet split.

    Returns (B, T, h*d_k), (B, S, n_kv_heads*d_k), (B, S, n_kv_heads*d_k), computed by ``layer.qkv`` called as a
    module; ``split_heads(q, layer.h)`` then gives the heads.

    Raises:
        TypeError: ``layer`` is not an ``mha.MultiHeadAttention``; otherwise as its ``forward`` for x and context.
    """
    if not isinstance(layer, MultiHeadAttention):
        raise TypeError(f"project needs an mha.MultiHeadAttention, got {type(layer).__name__}")
    layer._check(x, context, None, None, True)
    g = getattr(layer, "n_kv_heads", layer.h)
    widths = [layer.h * layer.d_k, g * layer.d_k, g * layer.d_k]
    q, k, v = layer.qkv(x).split(widths, dim=-1)
    if context is not None:  # K and V from the context, through the same module (as forward does)
        _, k, v = layer.qkv(context).split(widths, dim=-1)
    return q, k, v
