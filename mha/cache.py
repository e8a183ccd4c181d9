"""A key/value cache for incremental (token-by-token) decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keeps the keys and values of the tokens seen so far, for one attention layer.

    Decoding one token at a time, the keys and values of earlier tokens never
    change, so recomputing them at every step is wasted work. Pass one cache
    per layer as ``MultiHeadAttention.forward(x, cache=cache)``: each call
    appends the new tokens' K and V, and its queries attend to everything
    cached plus themselves (causally, aligned bottom-right).

    Shapes: ``k`` and ``v`` are (B, n_kv_heads, S, d_k), S = tokens so far.
    They live on the device and in the dtype of the first update.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new (B, n_kv_heads, T_new, d_k) keys and values; return all of them.

        Nothing is stored when it raises.

        Raises:
            ValueError: the new keys don't match the cached batch, heads or width.
            TypeError: their dtype or device differs from the cache's.
        """
        if self.k is None:
            # Copies, not the views it was given: a view into the fused qkv output would keep
            # all of it alive, Q included, while nbytes counted only K and V.
            self.k = k.clone(memory_format=torch.contiguous_format)
            self.v = v.clone(memory_format=torch.contiguous_format)
        else:
            if k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1] or v.shape != k.shape:
                raise ValueError(
                    f"new keys {tuple(k.shape)} / values {tuple(v.shape)} don't fit the cache "
                    f"{tuple(self.k.shape)}: batch, heads and d_k must match (use a fresh KVCache for a new batch)"
                )
            if (k.dtype, k.device) != (self.k.dtype, self.k.device):
                raise TypeError(
                    f"new keys are {k.dtype} on {k.device} but the cache holds {self.k.dtype} on "
                    f"{self.k.device}; use a fresh KVCache after changing the module's dtype or device"
                )
            self.k = torch.cat([self.k, k], dim=-2)  # (B, g, S + T_new, d_k)
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def __len__(self) -> int:
        """Number of cached positions S."""
        return 0 if self.k is None else self.k.size(-2)

    @property
    def nbytes(self) -> int:
        """Memory the cache keeps alive for its keys and values, in bytes.

        The cache owns its tensors (never views into a larger one), so this is
        exactly the size of their storages.
        """
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def reset(self) -> None:
        """Forget every cached position."""
        self.k = self.v = None

    def __repr__(self) -> str:
        shape = None if self.k is None else tuple(self.k.shape)
        return f"KVCache(len={len(self)}, k_shape={shape}, nbytes={self.nbytes})"
