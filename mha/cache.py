"""A key/value cache for incremental (token-by-token) decoding."""

from __future__ import annotations

import torch

from . import checks


class KVCache:
    """Keeps the keys and values of the tokens seen so far, for one attention layer.

    Decoding one token at a time, the keys and values of earlier tokens never
    change, so recomputing them at every step is wasted work. Pass one cache
    per layer as ``MultiHeadAttention.forward(x, cache=cache)``: each call
    appends the new tokens' K and V, and its queries attend to everything
    cached plus themselves (causally, aligned bottom-right).

    Two ways to store them:

    * ``KVCache()`` grows: each step concatenates the new keys to the old
      ones, which copies every cached position again (O(S²) copying over a
      generation of S tokens), but holds only what it needs.
    * ``KVCache(max_len=N)`` preallocates (B, n_kv_heads, N, d_k) buffers for
      K and V on the first update and writes each step into them in place,
      so a step copies only its new tokens. Use it when the generation length
      is known: it is faster, and under ``torch.compile`` one graph serves
      every step.

    Attributes:
        k, v: the cached keys and values, (B, n_kv_heads, S, d_k) with S =
            ``len(cache)``, or None before the first update. They live on the
            device and in the dtype of the first update. With ``max_len`` they
            are views of the first S positions of the buffers.
        max_len: the most positions a preallocated cache holds, or None.

    Raises:
        TypeError: ``max_len`` is not an int.
        ValueError: ``max_len`` is not positive.
    """

    def __init__(self, max_len: int | None = None) -> None:
        checks.cache_max_len(max_len)
        self.max_len = max_len
        self.reset()

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new (B, n_kv_heads, T_new, d_k) keys and values; return all of them.

        Returns:
            ``(k, v)``, each (B, n_kv_heads, S + T_new, d_k): with ``max_len``,
            views of the buffers that the next update writes after.

        Nothing is stored when it raises.

        Raises:
            ValueError: the new keys don't match the cached batch, heads or
                width, or, with ``max_len``, they would take the cache past it
                (names both).
            TypeError: their dtype or device differs from the cache's.
        """
        checks.cache_update(self, k, v)
        if self.max_len is None:
            if self.k is None:
                # Copies, not the views it was given: a view into the fused qkv output would keep
                # all of it alive, Q included, while nbytes counted only K and V.
                self.k = k.clone(memory_format=torch.contiguous_format)
                self.v = v.clone(memory_format=torch.contiguous_format)
            else:
                self.k = torch.cat([self.k, k], dim=-2)  # (B, g, S + T_new, d_k)
                self.v = torch.cat([self.v, v], dim=-2)
            return self.k, self.v
        S, T = len(self), k.size(-2)
        if self._k_buffer is None:
            B, g, _, d_k = k.shape
            self._k_buffer = k.new_empty(B, g, self.max_len, d_k)  # (B, g, max_len, d_k)
            self._v_buffer = v.new_empty(B, g, self.max_len, v.size(-1))
        # Written in place: only the new positions are copied, and the buffers never change shape.
        self._k_buffer[:, :, S : S + T] = k
        self._v_buffer[:, :, S : S + T] = v
        self.k = self._k_buffer[:, :, : S + T]  # (B, g, S + T_new, d_k)
        self.v = self._v_buffer[:, :, : S + T]
        return self.k, self.v

    def __len__(self) -> int:
        """Number of cached positions S."""
        return 0 if self.k is None else self.k.size(-2)

    @property
    def nbytes(self) -> int:
        """Memory the cache keeps alive for its keys and values, in bytes.

        The cache owns its tensors (never views into a larger one it did not
        make), so this is exactly the size of their storages: for a growing
        cache, 2·B·n_kv_heads·S·d_k elements; for a preallocated one, the
        whole buffers, 2·B·n_kv_heads·max_len·d_k elements, from the first
        update on, however few positions are filled. 0 before the first update
        and after ``reset()``.
        """
        owned = (self.k, self.v) if self.max_len is None else (self._k_buffer, self._v_buffer)
        return sum(t.numel() * t.element_size() for t in owned if t is not None)

    def reset(self) -> None:
        """Forget every cached position and free the memory; a preallocated cache allocates again on its next update."""
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self._k_buffer: torch.Tensor | None = None  # with max_len: (B, g, max_len, d_k); k is a view of it
        self._v_buffer: torch.Tensor | None = None

    def __repr__(self) -> str:
        shape = None if self.k is None else tuple(self.k.shape)
        max_len = "" if self.max_len is None else f", max_len={self.max_len}"
        return f"KVCache(len={len(self)}{max_len}, k_shape={shape}, nbytes={self.nbytes})"
