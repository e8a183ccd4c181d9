"""Checks of ``mha.KVCache``."""

from __future__ import annotations

import numbers

import torch

from .values import check_positive, sequence, tensor


def cache_max_len(max_len) -> None:
    if max_len is not None:
        check_positive(max_len=max_len)


def cache_update(cache, k, v, layer) -> None:
    """New keys and values that fit what the cache holds (batch, heads, d_k, dtype, device) and its max_len,
    from the layer that owns the cache (if it has one yet)."""
    owner = cache._layer  # set by eager calls only (see KVCache), and checked only there
    if owner is not None and owner is not layer and layer is not None and not torch.compiler.is_compiling():
        raise ValueError(
            f"this KVCache holds the keys of another layer, {type(owner).__name__}({owner.extra_repr()}); "
            "each layer needs its own KVCache (or reset() this one before another layer uses it)"
        )
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        tensor("k", k)
        tensor("v", v)
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"a KVCache takes keys and values of one shape (B, n_kv_heads, T_new, d_k), "
                         f"got k {tuple(k.shape)} and v {tuple(v.shape)}")
    cached = cache._k
    if cached is not None:
        if k.shape[:2] != cached.shape[:2] or k.shape[-1] != cached.shape[-1]:
            raise ValueError(
                f"new keys {tuple(k.shape)} / values {tuple(v.shape)} don't fit the cache "
                f"{tuple(cached.shape)}: batch, heads and d_k must match (use a fresh KVCache for a new batch)"
            )
        if k.dtype != cached.dtype or k.device != cached.device or v.dtype != k.dtype:
            raise TypeError(
                f"new keys are {k.dtype} on {k.device} but the cache holds {cached.dtype} on "
                f"{cached.device}; use a fresh KVCache after changing the module's dtype or device"
            )
    max_len = cache._max_len
    if max_len is not None:
        S, T = (0 if cached is None else cached.size(-2)), k.size(-2)
        if S + T > max_len:
            raise ValueError(
                f"{T} new positions after {S} cached would make {S + T}, past the cache's max_len={max_len}; "
                "make the KVCache with a larger max_len, or reset() it"
            )


def cache_beams(cache, beams) -> torch.Tensor:
    """``KVCache.reorder``'s beams as a 1-D int64 index on the cache's device, each in [0, B)."""
    if not isinstance(beams, torch.Tensor):
        beams = sequence("beams", beams, "batch row indices: a list of ints or a 1-D integer tensor")
        if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in beams):
            raise TypeError(f"beams must be batch row indices (ints), got {beams}")
        beams = torch.tensor(beams, dtype=torch.long)
    if beams.dtype.is_floating_point or beams.dtype.is_complex or beams.dtype == torch.bool:
        raise TypeError(f"beams must be an integer tensor of batch rows, got {beams.dtype}")
    if beams.dim() != 1:
        raise ValueError(f"beams must be 1-D (new batch,), got shape {tuple(beams.shape)}")
    if cache.k is None:
        return beams.long()
    B = cache.k.size(0)
    values = beams.tolist()
    if values and (min(values) < 0 or max(values) >= B):
        raise ValueError(f"beams must be batch rows in [0, B={B}), got {values}")
    return beams.to(device=cache.k.device, dtype=torch.long)


def read_only(name: str):
    raise AttributeError(
        f"KVCache.{name} cannot be assigned: a preallocated cache would ignore it. To reorder the batch rows "
        "(beam search) call cache.reorder(beams); to start again, cache.reset()"
    )
