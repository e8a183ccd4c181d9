"""A key/value cache for incremental (token-by-token) decoding."""

from __future__ import annotations

import numbers

import torch

from .values import check_positive, sequence, tensor


class KVCache:
    """Keeps the keys and values of the tokens seen so far, for one attention layer.

    Decoding one token at a time, the keys and values of earlier tokens never
    change, so recomputing them at every step is wasted work. Pass one cache
    per layer as ``MultiHeadAttention.forward(x, cache=cache)``: each call
    appends the new tokens' K and V, and its queries attend to everything
    cached plus themselves (causally, aligned bottom-right). A mask covers
    every key, cached ones included: S = ``len(cache)`` + the new tokens. For
    padded prompts, with ``pad`` the (B, S_max) padding mask of the whole
    sequences::

        cache = mha.KVCache()
        for t in range(T):
            y, _ = m(x[:, t : t + 1], mask=pad[:, None, None, : t + 1], cache=cache)

    Two ways to store them:

    * ``KVCache()`` grows: each step concatenates the new keys to the old
      ones, which copies every cached position again (O(S²) copying over a
      generation of S tokens), but holds only what it needs.
    * ``KVCache(max_len=N)`` preallocates (B, n_kv_heads, N, d_k) buffers for
      K and V on the first update and writes each step into them in place,
      so a step copies only its new tokens. Use it when the generation length
      is known: it is faster, and under ``torch.compile`` one graph serves
      every step. When the new keys need gradients (decoding outside
      ``torch.no_grad()`` with trainable weights), ``update`` returns copies
      of the filled positions, as a growing cache copies them: an earlier
      step's backward pass needs its keys as they were.

    Gradients flow through either kind: a loss on the decoded outputs has the
    gradients of the same loss on one causal call over the whole sequence.

    A cache serves one layer: the layer that first fills it owns it until
    ``reset()``, and another layer passing it raises (in eager mode; a step
    compiled with ``torch.compile`` does not record or check the owner).

    ``copy.copy(cache)`` and ``copy.deepcopy(cache)`` give an independent
    cache, as beam search needs to fork a hypothesis: copies of the keys and
    values (``clone()``, so gradients still flow back into the prefix that
    computed them), the same ``max_len``, and the same owner layer, not a copy
    of it; but a ``deepcopy`` that copies the owner layer too (a model that
    keeps its caches, deep-copied whole) gives the copy to the copied layer.
    Stepping the copy leaves the original as it was, and the other way round.

    A cache never holds a position twice. ``MultiHeadAttention`` stores a
    call's positions when the call returns, so a call that raises on the way
    (out of memory, a hook on ``out``) leaves the cache as it was, and the
    retried call appends its positions once. Gradient checkpointing
    (``torch.utils.checkpoint``, either ``use_reentrant``) reruns the
    checkpointed function in the backward pass: an update there would append
    its positions again, so it raises a RuntimeError that says so, and the
    cache keeps what the forward pass stored, once. Under ``torch.compile``
    the same holds: dynamo runs such a checkpoint eagerly (and refuses it
    with ``fullgraph=True``: "Unsafe side effect").

    A cache filled under ``torch.inference_mode()`` keeps working outside it:
    a preallocated one then continues in copies of its buffers (inference
    tensors cannot be written in place outside that mode).

    ``k``, ``v`` and ``max_len`` are read-only properties (``reorder`` and
    ``reset`` change what they hold). ``k`` and ``v`` are the cached keys and
    values, (B, n_kv_heads, S, d_k) with S = ``len(cache)``, or None before
    the first update; they live on the device and in the dtype of the first
    update, and with ``max_len`` they are views of the first S positions of
    the buffers.

    Raises:
        TypeError: ``max_len`` is not an int.
        ValueError: ``max_len`` is not positive.
    """

    def __init__(self, max_len: int | None = None) -> None:
        if max_len is not None:
            check_positive(max_len=max_len)
        self._max_len = max_len
        self.reset()

    @property
    def k(self) -> torch.Tensor | None:
        """The cached keys (B, n_kv_heads, S, d_k), or None before the first update."""
        return self._k

    @k.setter
    def k(self, value):
        _read_only("k")

    @property
    def v(self) -> torch.Tensor | None:
        """The cached values (B, n_kv_heads, S, d_k), or None before the first update."""
        return self._v

    @v.setter
    def v(self, value):
        _read_only("v")

    @property
    def max_len(self) -> int | None:
        """The most positions a preallocated cache holds, or None for a growing cache."""
        return self._max_len

    @max_len.setter
    def max_len(self, value):
        _read_only("max_len")

    def update(
        self, k: torch.Tensor, v: torch.Tensor, *, layer: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new (B, n_kv_heads, T_new, d_k) keys and values; return all of them.

        Args:
            k, v: the new positions' keys and values.
            layer: the module whose keys these are; it owns the cache from now
                until ``reset()`` (``MultiHeadAttention`` passes itself), and
                keys from another module raise.

        Returns:
            ``(k, v)``, each (B, n_kv_heads, S + T_new, d_k): with ``max_len``,
            views of the buffers that the next update writes after.

        Nothing is stored when it raises (a preallocated cache's first update
        may have allocated its buffers).

        Raises:
            ValueError: the new keys don't match the cached batch, heads or
                width, or, with ``max_len``, they would take the cache past it
                (names both), or they come from another layer than the
                cache's.
            TypeError: their dtype or device differs from the cache's.
            RuntimeError: it is called during a backward pass: gradient
                checkpointing recomputing the call that filled the cache.
        """
        k_all, v_all = self._extend(k, v, layer)
        self._store(k_all, v_all, layer)
        return k_all, v_all

    def _extend(self, k, v, layer):
        """What ``update`` returns, with nothing stored yet (a preallocated cache has written the new positions after
        its filled ones). ``MultiHeadAttention`` stores them with ``_store`` once its call has succeeded, so that a
        call that raises on the way (out of memory, a hook on ``out``) leaves the cache as it was."""
        if not torch.compiler.is_compiling():  # (eager only: a compiled graph's backward pass reruns no Python)
            _refuse_recomputation(self, k)
        self._check_update(k, v, layer)
        if self._max_len is None:
            if self._k is None:
                # Copies, not the views it was given: a view into the fused qkv output would keep
                # all of it alive, Q included, while nbytes counted only K and V.
                return k.clone(memory_format=torch.contiguous_format), v.clone(memory_format=torch.contiguous_format)
            return torch.cat([self._k, k], dim=-2), torch.cat([self._v, v], dim=-2)  # (B, g, S + T_new, d_k)
        S, T = len(self), k.size(-2)
        if self._k_buffer is None:
            B, g, _, d_k = k.shape
            self._k_buffer = k.new_empty(B, g, self._max_len, d_k)  # (B, g, max_len, d_k)
            self._v_buffer = v.new_empty(B, g, self._max_len, v.size(-1))
        elif not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()) and self._k_buffer.is_inference():
            # Filled under torch.inference_mode(): torch forbids writing such tensors in place outside it.
            # (Eager only: dynamo does not trace is_inference(), and a compiled step is not inference mode's.)
            self._k_buffer, self._v_buffer = self._k_buffer.clone(), self._v_buffer.clone()
        # Written in place: only the new positions are copied, and the buffers never change shape.
        self._k_buffer[:, :, S : S + T] = k
        self._v_buffer[:, :, S : S + T] = v
        k_all, v_all = self._k_buffer[:, :, : S + T], self._v_buffer[:, :, : S + T]  # (B, g, S + T_new, d_k)
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # The attention saves its keys and values for the backward pass, and the next step writes
            # into these same buffers: hand it copies, so that what it saved stays as it was.
            return k_all.clone(), v_all.clone()
        return k_all, v_all

    def _store(self, k, v, layer):
        """Hold ``_extend``'s keys and values of every position so far; the layer that gave them owns the cache."""
        if self._layer is None and layer is not None and not torch.compiler.is_compiling():  # (eager only)
            self._layer = layer
        if self._max_len is None:
            self._k, self._v = k, v
        else:  # views of the buffers, which _extend wrote (k and v may be copies of them)
            S = k.size(-2)
            self._k, self._v = self._k_buffer[:, :, :S], self._v_buffer[:, :, :S]

    def _check_update(self, k, v, layer) -> None:
        """New keys and values that fit what the cache holds (batch, heads, d_k, dtype, device) and its max_len,
        from the layer that owns the cache (if it has one yet)."""
        owner = self._layer  # set by eager calls only (see update), and checked only there
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
        cached = self._k
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
        if self._max_len is not None:
            S, T = len(self), k.size(-2)
            if S + T > self._max_len:
                raise ValueError(
                    f"{T} new positions after {S} cached would make {S + T}, past the cache's "
                    f"max_len={self._max_len}; make the KVCache with a larger max_len, or reset() it"
                )

    def reorder(self, beams: torch.Tensor | list[int]) -> None:
        """Keep batch rows ``beams`` of the cache, in that order: beam search's step between two tokens.

        After a step, beam search keeps the best continuations; new beam b
        continues old beam ``beams[b]``, so its cache must be that beam's
        (``reorder_cache`` in Hugging Face transformers). Rows may repeat or be
        dropped; the batch becomes ``len(beams)``. Both kinds of cache; an
        empty cache has nothing to reorder.

        Raises:
            TypeError: ``beams`` is not a sequence or tensor of integers.
            ValueError: ``beams`` is not 1-D, or names a row outside [0, B).
        """
        index = self._check_beams(beams)  # (new B,) int64, on the cache's device
        if self._k is None:
            return
        S = len(self)
        if self._max_len is not None:
            self._k_buffer = self._k_buffer.index_select(0, index)  # (new B, g, max_len, d_k)
            self._v_buffer = self._v_buffer.index_select(0, index)
            self._k, self._v = self._k_buffer[:, :, :S], self._v_buffer[:, :, :S]
        else:
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)

    def _check_beams(self, beams) -> torch.Tensor:
        """``reorder``'s beams as a 1-D int64 index on the cache's device, each in [0, B)."""
        if not isinstance(beams, torch.Tensor):
            beams = sequence("beams", beams, "batch row indices: a list of ints or a 1-D integer tensor")
            if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in beams):
                raise TypeError(f"beams must be batch row indices (ints), got {beams}")
            beams = torch.tensor(beams, dtype=torch.long)
        if beams.dtype.is_floating_point or beams.dtype.is_complex or beams.dtype == torch.bool:
            raise TypeError(f"beams must be an integer tensor of batch rows, got {beams.dtype}")
        if beams.dim() != 1:
            raise ValueError(f"beams must be 1-D (new batch,), got shape {tuple(beams.shape)}")
        if self._k is None:
            return beams.long()
        B = self._k.size(0)
        values = beams.tolist()
        if values and (min(values) < 0 or max(values) >= B):
            raise ValueError(f"beams must be batch rows in [0, B={B}), got {values}")
        return beams.to(device=self._k.device, dtype=torch.long)

    def __copy__(self) -> KVCache:
        """An independent cache: copies of the keys and values (and buffers), the same max_len and owner layer."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)  # max_len, the owner layer (the same one), and any subclass state
        if self._k is None:
            return new
        S = len(self)
        if self._max_len is None:
            new._k, new._v = self._k.clone(), self._v.clone()
        else:  # new buffers, so that neither cache's next step writes into the other's
            new._k_buffer, new._v_buffer = self._k_buffer.clone(), self._v_buffer.clone()
            new._k, new._v = new._k_buffer[:, :, :S], new._v_buffer[:, :, :S]
        return new

    def __deepcopy__(self, memo) -> KVCache:
        """As ``copy.copy``: the tensors are copied; the owner layer is not (the copy serves the same layer), unless
        this deepcopy has copied it already (a model deep-copied with its caches): then the copy serves the copy."""
        new = self.__copy__()
        new._layer = memo.get(id(self._layer), self._layer)
        return new

    def __len__(self) -> int:
        """Number of cached positions S."""
        return 0 if self._k is None else self._k.size(-2)

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
        owned = (self._k, self._v) if self._max_len is None else (self._k_buffer, self._v_buffer)
        return sum(t.numel() * t.element_size() for t in owned if t is not None)

    def reset(self) -> None:
        """Forget every cached position (and the layer that owned it) and free the memory.

        A preallocated cache allocates again on its next update.
        """
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._k_buffer: torch.Tensor | None = None  # with max_len: (B, g, max_len, d_k); k is a view of it
        self._v_buffer: torch.Tensor | None = None
        self._layer: torch.nn.Module | None = None  # the layer whose keys these are

    def __repr__(self) -> str:
        shape = None if self._k is None else tuple(self._k.shape)
        max_len = "" if self._max_len is None else f", max_len={self._max_len}"
        return f"KVCache(len={len(self)}{max_len}, k_shape={shape}, nbytes={self.nbytes})"


def _read_only(name: str):
    raise AttributeError(
        f"KVCache.{name} cannot be assigned: a preallocated cache would ignore it. To reorder the batch rows "
        "(beam search) call cache.reorder(beams); to start again, cache.reset()"
    )


def _refuse_recomputation(cache: KVCache, k: torch.Tensor) -> None:
    """Raise when an update comes during a backward pass: gradient checkpointing rerunning the call that filled
    the cache (case C24), which would append its positions a second time."""
    if torch._C._current_graph_task_id() == -1:  # not in a backward pass
        return
    raise RuntimeError(
        f"KVCache.update during a backward pass: gradient checkpointing (torch.utils.checkpoint) is recomputing a "
        f"call that filled this KVCache, and would append its {k.size(-2)} new positions a second time. The cache "
        f"keeps what the forward pass stored ({len(cache)} positions, each once). Call the layer outside the "
        "checkpointed function when it uses a cache, or without a cache inside it (training on whole sequences "
        "needs none)"
    )
