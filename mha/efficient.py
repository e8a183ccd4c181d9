"""Notebook 07's extensions of the lesson layer: grouped-query attention and the key/value cache for decoding.

:class:`GroupedQueryAttention` is :class:`mha.MultiHeadAttention` with fewer key/value heads than query heads
(Ainslie et al. 2023; Shazeer 2019 for one, multi-query attention), and a :class:`KVCache` to decode one token at
a time. With as many K/V heads as query heads it is the lesson layer, weight for weight.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn
from torch.utils.module_tracker import ModuleTracker

from .attention import attend
from .multihead import MultiHeadAttention, check_sizes


class GroupedQueryAttention(MultiHeadAttention):
    """h query heads sharing n_kv_heads key/value heads, and an optional :class:`KVCache` for decoding.

    Query head i uses K/V head i // (h / n_kv_heads): each K/V head serves h / n_kv_heads query heads, so the
    layer projects and caches n_kv_heads heads of keys and values instead of h. n_kv_heads = 1 is multi-query
    attention; n_kv_heads = h (the default) is multi-head attention, and then the layer is built exactly as
    :class:`mha.MultiHeadAttention` is (the same weights from the same seed).

    Args:
        d_model, h, bias, dropout, device, dtype: as :class:`mha.MultiHeadAttention`.
        n_kv_heads: the number of K/V heads; it must divide h. None means h.
        d_k: the width of each head; None means d_model / h. Given, the heads' total width h * d_k may differ
            from d_model, as Hugging Face's ``head_dim`` allows (and as a layer holding some heads needs).

    Attributes:
        qkv: ``nn.Linear(d_model, (h + 2 * n_kv_heads) * d_k)``, rows [W_Q; W_K; W_V]; out: W_O,
            ``nn.Linear(h * d_k, d_model)``.

    Raises:
        As :class:`mha.MultiHeadAttention`; ValueError also when n_kv_heads does not divide h.
    """

    def __init__(self, d_model: int, h: int, n_kv_heads: int | None = None, *, d_k: int | None = None,
                 bias: bool = True, dropout: float = 0.0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        n_kv_heads = h if n_kv_heads is None else n_kv_heads
        check_sizes(d_model=d_model, h=h, n_kv_heads=n_kv_heads, **({} if d_k is None else {"d_k": d_k}))
        if h % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide h={h}")
        plain = n_kv_heads == h and (d_k is None or d_k * h == d_model)
        # Other sizes: the lesson's layer on the meta device (no random numbers drawn), then the projections. An
        # explicit d_k frees d_model from being a multiple of h, so that layer is then made with one head.
        super().__init__(d_model, h if d_k is None or plain else 1, bias=bias, dropout=dropout,
                         device=device if plain else "meta", dtype=dtype)
        self.h, self.n_kv_heads, self.d_k = int(h), int(n_kv_heads), self.d_k if d_k is None else int(d_k)
        if not plain:
            self.qkv = nn.Linear(d_model, (h + 2 * n_kv_heads) * self.d_k, bias=bias, device=device, dtype=dtype)
            self.out = nn.Linear(h * self.d_k, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, *, causal: bool | None = None,
                mask: torch.Tensor | None = None, need_weights: bool = True, cache: KVCache | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`mha.MultiHeadAttention.forward`, with a ``cache`` for decoding (self-attention only).

        With a cache, the new tokens' keys and values are appended to it, and x's T queries attend to every
        cached position and themselves: S = ``len(cache)`` + T, causal aligned bottom-right, and a mask covers
        all S keys. The cache keeps the new positions only when ``forward`` returns: a call that raises inside it
        (a hook on ``out``, out of memory) leaves the cache as it was (case C29). A model's step that fails after
        some layers returned leaves their caches extended: ``copy.copy`` the caches before a step you may retry.

        Returns:
            ``(y, w)``: y (B, T, d_model), w (B, h, T, S) or None.

        Raises:
            As :meth:`mha.MultiHeadAttention.forward`; ValueError also for a cache with a context, new tokens
            that do not fit the cache (another batch, past its ``max_len``), or a cache another layer filled;
            TypeError for a cache that is not a :class:`KVCache`.
        """
        if cache is not None and (context is not None or not isinstance(cache, KVCache)):
            raise (ValueError if context is not None else TypeError)(
                "a KVCache is for self-attention decoding; don't pass it with a context" if context is not None
                else f"cache must be an mha.KVCache, got {type(cache).__name__}")
        causal, keep = self._check(x, context, causal, None, need_weights)
        B, T, _ = x.shape
        if mask is not None:  # checked against every key, the cached ones included
            S = (x if context is None else context).size(1) + (0 if cache is None else len(cache))
            keep = self._check_mask(mask, B, T, S, x.device)
        h, g, d_k = self.h, self.n_kv_heads, self.d_k
        q, k, v = self.qkv(x).split([h * d_k, g * d_k, g * d_k], dim=-1)  # (B, T, h*d_k), (B, T, g*d_k) twice
        if context is not None:
            _, k, v = self.qkv(context).split([h * d_k, g * d_k, g * d_k], dim=-1)
        q = q.view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
        k, v = (t.view(B, t.size(1), g, d_k).transpose(1, 2) for t in (k, v))  # (B, g, S, d_k)
        if cache is None:
            return self._attend(q, k, v, keep, causal, need_weights)
        with cache.extended(k, v, layer=self) as (k, v):  # every position so far: (B, g, len(cache) + T, d_k)
            return self._attend(q, k, v, keep, causal, need_weights)

    def _attend(self, q, k, v, keep, causal, need_weights):
        r = self.h // self.n_kv_heads
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)  # K/V head j serves query heads rj..
        dropout = self.dropout if self.training else 0.0
        o, w = attend(q, k, v, keep, is_causal=causal, dropout_p=dropout, need_weights=need_weights)
        B, _, T, _ = q.shape
        return self.out(o.transpose(1, 2).reshape(B, T, self.h * self.d_k)), w  # the heads side by side: (B, T, h*d_k)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, h={self.h}, n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, "
                f"dropout={self.dropout}")


class KVCache:
    """The keys and values of the tokens seen so far, for one attention layer.

    Decoding one token at a time, earlier tokens' keys and values never change, so recomputing them at every step
    is wasted work. Pass one cache per layer, ``GroupedQueryAttention.forward(x, cache=cache)``: each call appends
    the new tokens' K and V, and its queries attend to everything cached plus themselves. For padded prompts, with
    ``pad`` the (B, S_max) padding mask of the whole sequences::

        cache = mha.KVCache()
        for t in range(T):
            y, _ = m(x[:, t : t + 1], mask=pad[:, None, None, : t + 1], cache=cache)

    ``KVCache()`` grows: each step concatenates, which copies every cached position again (O(S^2) copying over a
    generation), but holds only what it needs. ``KVCache(max_len=N)`` allocates (B, n_kv_heads, N, d_k) buffers on
    its first step and writes each step into them in place: faster when the length is known. While the keys need
    gradients, it hands the attention copies of the filled positions, which an earlier step's backward pass needs as
    they were. Gradients flow through either kind.

    A cache serves one layer: the layer that first fills it owns it until ``reset()``. ``reorder(beams)`` keeps
    some batch rows, as beam search needs (case C18); ``copy.copy`` and ``copy.deepcopy`` give an independent cache
    (a deepcopy that copies the owner layer too gives the copy to the copied layer). A cache never holds a position
    twice: a call that raises leaves it as it was, buffers included (case C29), and gradient checkpointing, which
    reruns the call in the backward pass, is refused there (case C24).

    Attributes (read-only): ``k`` and ``v``, the cached keys and values (B, n_kv_heads, S, d_k), S = ``len(cache)``,
    or None before the first step; ``max_len``; ``nbytes``.

    Raises:
        TypeError: ``max_len`` is not an int. ValueError: it is not positive.
    """

    def __init__(self, max_len: int | None = None) -> None:
        if max_len is not None:
            check_sizes(max_len=max_len)
        self._max_len = max_len
        self.reset()

    @property
    def k(self) -> torch.Tensor | None:
        """The cached keys (B, n_kv_heads, S, d_k), or None before the first step."""
        return self._k

    @property
    def v(self) -> torch.Tensor | None:
        """The cached values (B, n_kv_heads, S, d_k), or None before the first step."""
        return self._v

    @property
    def max_len(self) -> int | None:
        """The most positions a preallocated cache holds, or None for a growing cache."""
        return self._max_len

    def extended(self, k: torch.Tensor, v: torch.Tensor, *, layer: nn.Module | None = None) -> _Extended:
        """The cache's one way in: ``with cache.extended(k, v) as (k_all, v_all): ...``.

        Appends the new (B, n_kv_heads, T, d_k) keys and values and gives every position so far, (B, n_kv_heads,
        S + T, d_k). The cache keeps them only if the ``with`` block finishes: an exception inside it puts back
        everything the cache held, its buffers included (case C29). ``layer``, the module whose keys these are,
        owns the cache from its first step until ``reset()``. What raises, raises on entering the block, before
        anything changes.

        Raises:
            ValueError: the keys do not fit the cache (batch, heads, d_k; past ``max_len``), or come from another
                layer than the one that owns it.
            TypeError: their dtype or device differs from the cache's.
            RuntimeError: it runs during a backward pass: gradient checkpointing recomputing the call that filled
                the cache (case C24).
        """
        return _Extended(self, k, v, layer)

    def reorder(self, beams: torch.Tensor | list[int]) -> None:
        """Keep batch rows ``beams`` of the cache, in that order: beam search's step between two tokens.

        New beam b continues old beam ``beams[b]``; rows may repeat or be dropped, and the batch becomes
        ``len(beams)`` (``reorder_cache`` in Hugging Face transformers). An empty cache has nothing to reorder.

        Raises:
            TypeError: ``beams`` is not a list or 1-D tensor of integers.
            ValueError: ``beams`` is not 1-D, or names a row outside [0, B).
        """
        if not isinstance(beams, torch.Tensor) and hasattr(beams, "__array__"):  # a NumPy array
            beams = torch.as_tensor(beams)
        if isinstance(beams, torch.Tensor):
            if beams.dtype.is_floating_point or beams.dtype.is_complex or beams.dtype == torch.bool:
                raise TypeError(f"beams must be an integer tensor of batch rows, got {beams.dtype}")
            if beams.dim() != 1:
                raise ValueError(f"beams must be 1-D (new batch,), got shape {tuple(beams.shape)}")
            beams = beams.tolist()
        if not isinstance(beams, (list, tuple, range)) or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in beams):
            raise TypeError(f"beams must be batch row indices: a list of ints or a 1-D integer tensor, got "
                            f"{type(beams).__name__} {beams!r}")
        if self._k is None:
            return
        B, S = self._k.size(0), len(self)
        if beams and (min(beams) < 0 or max(beams) >= B):
            raise ValueError(f"beams must be batch rows in [0, B={B}), got {list(beams)}")
        index = torch.tensor([int(i) for i in beams], dtype=torch.long, device=self._k.device)
        # Both copies are made before either is kept: out of memory between them leaves the cache as it was.
        if self._max_len is None:
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)
        else:
            k, v = self._k_buffer.index_select(0, index), self._v_buffer.index_select(0, index)
            self._k_buffer, self._v_buffer = k, v
            self._k, self._v = self._k_buffer[:, :, :S], self._v_buffer[:, :, :S]

    def _snapshot(self) -> dict:
        """References to what the cache holds and the buffers it holds them in (``_restore`` puts them back). Named,
        not ``dict(self.__dict__)``, which torch.compile on torch 2.6 cannot trace."""
        return {name: getattr(self, name) for name in _STATE}

    def _restore(self, saved: dict) -> None:
        for name, value in saved.items():
            setattr(self, name, value)

    def __len__(self) -> int:
        """The number of cached positions S."""
        return 0 if self._k is None else self._k.size(-2)

    @property
    def nbytes(self) -> int:
        """The bytes the cache keeps alive: 2·B·n_kv_heads·S·d_k elements for a growing cache, its whole buffers
        (2·B·n_kv_heads·max_len·d_k) for a preallocated one, 0 before the first step (case C12)."""
        owned = (self._k, self._v) if self._max_len is None else (self._k_buffer, self._v_buffer)
        return sum(t.numel() * t.element_size() for t in owned if t is not None)

    def reset(self) -> None:
        """Forget every cached position and the layer that owned them, and free the memory."""
        self._k = self._v = self._k_buffer = self._v_buffer = None
        self._layer = None

    def __copy__(self) -> KVCache:
        """An independent cache: copies of the keys and values (and buffers), the same max_len and owner layer."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        if self._max_len is not None and self._k is not None:  # new buffers: neither cache writes into the other's
            new._k_buffer, new._v_buffer = self._k_buffer.clone(), self._v_buffer.clone()
            new._k, new._v = new._k_buffer[:, :, : len(self)], new._v_buffer[:, :, : len(self)]
        elif self._k is not None:
            new._k, new._v = self._k.clone(), self._v.clone()
        return new

    def __deepcopy__(self, memo) -> KVCache:
        new = self.__copy__()
        new._layer = memo.get(id(self._layer), self._layer)  # the copied layer, if this deepcopy copied it
        return new

    def __repr__(self) -> str:
        shape = None if self._k is None else tuple(self._k.shape)
        max_len = "" if self._max_len is None else f", max_len={self._max_len}"
        return f"KVCache(len={len(self)}{max_len}, k_shape={shape}, nbytes={self.nbytes})"

    def _check(self, k, v, layer) -> None:
        owner = self._layer
        if owner is not None and layer is not None and owner is not layer:
            raise ValueError(f"this KVCache holds the keys of another layer, {type(owner).__name__}"
                             f"({owner.extra_repr()}); each layer needs its own KVCache (or reset() this one)")
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.dim() != 4 or v.shape != k.shape:
            raise ValueError(f"a KVCache takes keys and values of one shape (B, n_kv_heads, T, d_k), got "
                             f"{getattr(k, 'shape', k)} and {getattr(v, 'shape', v)}")
        if self._k is not None:
            if k.shape[:2] != self._k.shape[:2] or k.size(-1) != self._k.size(-1):
                raise ValueError(f"new keys {tuple(k.shape)} don't fit the cache {tuple(self._k.shape)}: batch, heads "
                                 "and d_k must match (use a fresh KVCache for a new batch)")
            if k.dtype != self._k.dtype or k.device != self._k.device or v.dtype != k.dtype:
                raise TypeError(f"new keys are {k.dtype} on {k.device} but the cache holds {self._k.dtype} on "
                                f"{self._k.device}; use a fresh KVCache after changing the module's dtype or device")
        if self._max_len is not None and len(self) + k.size(-2) > self._max_len:
            raise ValueError(f"{k.size(-2)} new positions after {len(self)} cached would make "
                             f"{len(self) + k.size(-2)}, past the cache's max_len={self._max_len}; make the KVCache "
                             "with a larger max_len, or reset() it")
        if not torch.compiler.is_compiling() and _TRACKER.is_bw:
            raise RuntimeError(
                f"a KVCache step during a backward pass: gradient checkpointing (torch.utils.checkpoint) is "
                f"recomputing a call that filled this KVCache and would append its {k.size(-2)} positions a second "
                f"time; the cache keeps the {len(self)} the forward pass stored. Call the layer outside the "
                "checkpointed function when it uses a cache, or without a cache inside it")

    def _append(self, k, v):
        """Every position so far, stored: with max_len, the new ones written into the buffers in place."""
        if self._max_len is None:
            if self._k is None:  # copies, not views into the fused projection, which would keep all of it alive
                self._k, self._v = k.contiguous().clone(), v.contiguous().clone()
            else:
                self._k, self._v = torch.cat([self._k, k], dim=-2), torch.cat([self._v, v], dim=-2)
            return self._k, self._v
        S, T = len(self), k.size(-2)
        if self._k_buffer is None:
            self._k_buffer = k.new_empty(*k.shape[:2], self._max_len, k.size(-1))  # (B, g, max_len, d_k)
            self._v_buffer = v.new_empty(*v.shape[:2], self._max_len, v.size(-1))
        elif (not torch.compiler.is_compiling() and self._k_buffer.is_inference()
              and not torch.is_inference_mode_enabled()):
            # Filled under torch.inference_mode() (a prompt, say): such tensors take no in-place write outside it.
            # (Dynamo cannot trace is_inference(); under compile, torch.no_grad() is the recipe.)
            self._k_buffer, self._v_buffer = self._k_buffer.clone(), self._v_buffer.clone()
        self._k_buffer[:, :, S : S + T] = k
        self._v_buffer[:, :, S : S + T] = v
        self._k, self._v = self._k_buffer[:, :, : S + T], self._v_buffer[:, :, : S + T]
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            return self._k.clone(), self._v.clone()  # the next step writes into the buffers this one's backward needs
        return self._k, self._v


class _Extended:
    """What ``KVCache.extended`` returns: on entering, the cache appends; on an exception, it is put back."""

    def __init__(self, cache, k, v, layer):
        self.cache, self.k, self.v, self.layer = cache, k, v, layer

    def __enter__(self):
        cache = self.cache
        cache._check(self.k, self.v, self.layer)
        self.saved = cache._snapshot()
        try:  # (Python calls no __exit__ when __enter__ raises: allocating the buffers may run out of memory)
            if cache._layer is None and not torch.compiler.is_compiling():
                cache._layer = self.layer
            return cache._append(self.k, self.v)
        except BaseException:
            cache._restore(self.saved)
            raise

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self.cache._restore(self.saved)
        return False


_STATE = ("_k", "_v", "_k_buffer", "_v_buffer", "_layer")  # all that a step changes in a KVCache (reset() sets them)
_TRACKER = ModuleTracker()  # its is_bw says whether a backward pass is running (gradient checkpointing, C24)
