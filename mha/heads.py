"""Split the embedding into heads and merge the heads back.

These two reshapes are the whole "multi" in multi-head attention: one wide
projection is viewed as h narrow ones, and the h outputs are laid side by side
again before W_O.
"""

import torch

from .values import check_positive, tensor


def split_heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, T, h*d_k) -> (B, h, T, d_k).

    Each head gets its own d_k-wide slice of the *projected* vector; every
    slice was computed from the whole input embedding.

    Raises:
        TypeError: x is not a tensor.
        ValueError: x is not 3-D or its width is not a multiple of h.
    """
    if type(h) is not int or h <= 0:
        check_positive(h=h)
    if not isinstance(x, torch.Tensor):
        tensor("x", x)
    if x.dim() != 3 or x.size(-1) % h:
        raise ValueError(f"split_heads needs (B, T, h*d_k) with h={h}, got shape {tuple(x.shape)}")
    B, T, _ = x.shape
    return x.view(B, T, h, x.size(-1) // h).transpose(1, 2)  # (B, T, h, d_k) -> (B, h, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h*d_k), the inverse of :func:`split_heads`.

    The order matters: move h next to d_k first, then flatten them. Reshaping
    (B, h, T, d_k) straight to (B, T, h*d_k) also runs, but mixes heads with
    time steps (case C6).

    Raises:
        TypeError: x is not a tensor.
        ValueError: x is not 4-D.
    """
    if not isinstance(x, torch.Tensor):
        tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"merge_heads needs (B, h, T, d_k), got shape {tuple(x.shape)}")
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, h, d_k) -> (B, T, h*d_k)
