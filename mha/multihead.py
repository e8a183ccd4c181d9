"""The multi-head attention layer (Vaswani et al. 2017, §3.2.2)."""

from __future__ import annotations

import torch
from torch import nn

from .attention import attend
from .cache import KVCache
from .masks import as_keep_mask
from .parameters import LayerParameters
from .precision import HALF, autocast_casts
from .values import check_positive, divisors, dropout, fits, flags, tensor


class MultiHeadAttention(LayerParameters, nn.Module):
    """h attentions in parallel, each on its own d_k-wide projection, mixed by W_O.

        head_i = Attention(x W_Q_i, c W_K_i, c W_V_i)
        y      = Concat(head_1, ..., head_h) W_O       (Vaswani et al. 2017, §3.2.2)

    One ``nn.Linear`` (``qkv``) computes Q, K and V for every head at once;
    its output is viewed as (B, h, T, d_k) (as :func:`mha.split_heads` does).
    Every head still sees the whole embedding: only the *projected* vector is
    split.

    Args:
        d_model: embedding width; must be divisible by h unless d_k is given.
        h: number of query heads.
        n_kv_heads: number of K/V heads (grouped-query attention); must divide
            h. None means h (plain multi-head attention); 1 is multi-query
            attention. Query head i shares K/V head i // (h / n_kv_heads).
        d_k: width of each head. None means d_model // h, so that the heads
            together are d_model wide (Vaswani et al.). Given explicitly, the
            inner width h * d_k may differ from d_model, as Hugging Face's
            ``head_dim`` allows (and as a layer made of some heads needs).
        bias: whether ``qkv`` and ``out`` have biases.
        dropout: attention-weight dropout, used only in training mode.
        device, dtype: passed to the parameters.

    Attributes:
        h, d_k, n_kv_heads, d_model, dropout.
        qkv: ``nn.Linear(d_model, (h + 2 * n_kv_heads) * d_k)``. Its
            weight rows are [W_Q; W_K; W_V], the layout of
            ``nn.MultiheadAttention.in_proj_weight`` (for n_kv_heads = h and
            the default d_k that is ``nn.Linear(d_model, 3 * d_model)``).
        out: W_O, ``nn.Linear(h * d_k, d_model)``.

    ``qkv`` and ``out`` hold its only tensors, and every path calls them as
    modules (cross-attention calls ``qkv`` on x and on the context), so a
    forward hook, a parametrization, pruning, dynamic quantization or an
    adapter that wraps them (LoRA) acts on every call; ``from_heads`` and
    ``mha.to_torch``, which copy their weights instead, refuse a wrapped one.
    The head counts reach the ``state_dict`` beside the weights, as its
    ``_extra_state``, and ``load_state_dict`` refuses a checkpoint of other
    head counts (see :class:`mha.parameters.LayerParameters`).

    Raises:
        TypeError: a size is not an int.
        ValueError: d_model % h != 0 without an explicit d_k (names both),
            n_kv_heads does not divide h, a size is not positive, or dropout
            is outside [0, 1).
    """

    def __init__(
        self,
        d_model: int,
        h: int,
        *,
        n_kv_heads: int | None = None,
        d_k: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = h if n_kv_heads is None else n_kv_heads
        _check_sizes(d_model, h, n_kv_heads, d_k, dropout)
        d_k = d_model // h if d_k is None else d_k
        self.d_model, self.h, self.d_k, self.n_kv_heads = d_model, h, d_k, n_kv_heads
        self.dropout = float(dropout)
        self._widths = [h * d_k, n_kv_heads * d_k, n_kv_heads * d_k]  # rows of W_Q, W_K, W_V in qkv
        self.qkv = nn.Linear(d_model, sum(self._widths), bias=bias, device=device, dtype=dtype)
        self.out = nn.Linear(h * d_k, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, *, causal: bool | None = None,
                mask: torch.Tensor | None = None, need_weights: bool = True, cache: KVCache | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from x to itself (or to ``context``) and project back to d_model.

        Args:
            x: (B, T, d_model), on the module's device, in its dtype or, under
                an active ``torch.autocast``, in the autocast dtype (float32
                parameters with bfloat16 activations, as ``nn.MultiheadAttention``
                accepts them there; scores and softmax run in float32).
            context: (B, S, d_model) supplying the keys and values
                (cross-attention); None means self-attention, S = T.
            causal: whether query i attends only to keys up to i, aligned
                bottom-right when a cache makes S > T. None (the default)
                means causal for self-attention and not for cross-attention.
                ``causal=True`` with a ``context`` raises: x and context are
                different sequences, so "later" has no meaning between them;
                pass ``mask`` to restrict cross-attention.
            mask: keep-mask (True/1 = may attend) that broadcasts to
                (B, h, T, S); combined with ``causal``, a key must be allowed
                by both. A (B, S) padding mask goes in as
                ``mask[:, None, None, :]`` (see ``mha.padding_mask``), a
                per-sample (B, T, S) mask as ``mask[:, None]``. Shapes follow
                broadcasting from the right, so a 2-D mask is always (T, S)
                and a 3-D one (h, T, S), even when B happens to equal T or h.
                Under ``torch.compile(fullgraph=True)`` pass a bool mask: the
                values of an integer or float one are checked by reading them.
                With NaN in padded rows of x, the padding mask alone keeps the
                real tokens' outputs exact but not their gradients (the padded
                queries' NaN weights reach every key's gradient): mask the
                padded queries too, ``keep = pad[:, None, :, None] &
                pad[:, None, None, :]`` (B, 1, T, S), ``pad`` the (B, S)
                padding mask, for a finite gradient of x; for finite weight
                gradients replace the rows, ``x.masked_fill(~pad[..., None],
                0.0)`` (the mask convention page:
                https://transformer-on-ramp.github.io/mha/mask_convention.html).
            need_weights: True returns the per-head weights; False returns
                None and takes the fused ``F.scaled_dot_product_attention`` path.
                Both give the same numbers under every kind of differentiation
                (higher order, forward mode, ``torch.func``); see
                ``mha.scaled_dot_product_attention``.
            cache: a ``KVCache`` for incremental decoding (self-attention
                only). The new keys and values are appended to it, and S
                becomes the number of cached positions. Nothing is stored
                when the call raises, wherever it raises.

        Returns:
            ``(y, w)``: y (B, T, d_model), and w the per-head weights
            (B, h, T, S), not averaged over heads, or None.

        Raises:
            TypeError: x or context is not a dense floating tensor (a nested
                tensor: pad it and pass a padding mask), or (outside autocast) not
                in the module's dtype; the message says how to convert for pure
                low precision and how to use autocast for mixed precision.
            ValueError: wrong rank or width, a context whose batch differs, a
                mask that does not broadcast to (B, h, T, S) or is not 0/1,
                ``causal=True`` or a cache together with a context, new tokens that do not fit the
                cache (another batch, or past its ``max_len``), a cache that
                another layer filled.
            RuntimeError: a call with a cache that gradient checkpointing
                recomputes in the backward pass (see ``KVCache``).
        """
        keep, causal = self._check_inputs(x, context, causal, mask, need_weights, cache)  # bool or None; bool
        q, k, v = self._project_heads(x, context, keep)  # (B, h, T, d_k), (B, g, S, d_k), (B, g, S, d_k)
        if cache is not None:
            k, v = cache._extend(k, v, layer=self)  # (B, g, S_cached + T, d_k): every position so far
        out, w = attend(q, k, v, keep, is_causal=causal, dropout_p=self.dropout if self.training else 0.0,
                        need_weights=need_weights, enable_gqa=self.n_kv_heads != self.h)  # (B, h, T, d_k), (B, h, T, S)
        # The heads side by side again, as mha.merge_heads does: (B, h, T, d_k) -> (B, T, h, d_k) -> (B, T, h*d_k).
        y = self.out(out.transpose(1, 2).flatten(2))  # (B, T, d_model)
        if cache is not None:  # stored now that the call succeeded: one that raises leaves the cache as it was
            cache._store(k, v, layer=self)
        return y, w

    def _project_heads(self, x, context, keep):
        """Q from x, K and V from ``context`` (or x), in heads: (B, h, T, d_k), (B, g, S, d_k), (B, g, S, d_k)."""
        h, g = self.h, self.n_kv_heads
        # qkv's output is Q, K and V side by side, each a whole number of d_k-wide heads, so it splits into
        # h + 2g heads at once, as mha.split_heads does: h query heads, then g key and g value heads.
        # (The same views as splitting Q, K, V first, in 3 tensor ops instead of 7.)
        q, k, v = self.qkv(x).unflatten(-1, (h + 2 * g, self.d_k)).transpose(1, 2).split([h, g, g], dim=1)
        if context is not None:
            k, v = self._project_context(context, keep)
        return q, k, v

    def _project_context(self, context, keep):
        """Cross-attention's K and V, (B, g, S, d_k) each, from ``context`` through ``qkv`` called as a module, so
        that what wraps it (a hook, an adapter) acts here as on x (case C23); its queries are left unused.

        The context's rows that no query may see are zeroed first. They are padding (an encoder's, which may
        hold NaN), blocked anyway, and qkv's weight gradient multiplies every row it ran on: W_Q's would be
        0 * NaN through the unused queries, W_K's and W_V's through the blocked keys.
        """
        if keep is not None:
            seen = keep[(None,) * (4 - keep.dim())].any(dim=2).any(dim=1)  # (B or 1, S): may a query see key j?
            context = torch.where(seen[..., None], context, 0.0)
        h, g = self.h, self.n_kv_heads
        _, k, v = self.qkv(context).unflatten(-1, (h + 2 * g, self.d_k)).transpose(1, 2).split([h, g, g], dim=1)
        return k, v

    def project(
        self, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q from x; K and V from ``context`` (or x). All heads at once, not yet split.

        Returns (B, T, h*d_k), (B, S, n_kv_heads*d_k), (B, S, n_kv_heads*d_k).

        Raises:
            As ``forward`` for x and context.
        """
        self._check_inputs(x, context)
        q, k, v = self.qkv(x).split(self._widths, dim=-1)
        if context is not None:  # K and V from the context, through the same module (see forward)
            _, k, v = self.qkv(context).split(self._widths, dim=-1)
        return q, k, v

    def extra_repr(self) -> str:
        kv = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.h else ""
        return f"d_model={self.d_model}, h={self.h}, d_k={self.d_k}{kv}, dropout={self.dropout}"

    def _check_inputs(self, x, context=None, causal=None, mask=None, need_weights=True, cache=None):
        """``forward``'s inputs, checked: (the mask as a bool keep-mask on x's device, or None; whether the
        attention is causal, None meaning "for self-attention").

        Checks everything before the call changes anything (the cache, say), the mask against (B, h, T, S),
        where S counts the cached positions too. It runs on every call, one decoding step included, so the
        common case takes the fewest Python operations.
        """
        self._check_input("x", x)
        if context is not None:
            self._check_input("context", context)
            if context.size(0) != x.size(0):
                raise ValueError(f"context batch {context.size(0)} differs from x batch {x.size(0)}: "
                                 f"x {tuple(x.shape)}, context {tuple(context.shape)}")
        if causal is None:
            causal = context is None  # causal self-attention; cross-attention has no order between x and context
        elif type(causal) is not bool:
            flags(causal=causal)
        elif causal and context is not None:
            raise ValueError("causal=True with a context: x and context are different sequences, so no key comes "
                             "'after' a query; leave causal out (or pass False) for cross-attention, and pass a "
                             "mask to restrict it")
        if type(need_weights) is not bool:
            flags(need_weights=need_weights)
        if cache is not None and (context is not None or not isinstance(cache, KVCache)):
            _refuse_cache(context, cache)
        if self.training:
            dropout(self.dropout)  # checked when the layer was made, but an attribute can be changed since
        if mask is None:
            return None, causal
        B, T = x.shape[:2]
        S = (x if context is None else context).size(1) + (0 if cache is None else len(cache))  # and cached keys
        keep = as_keep_mask(mask, device=x.device)
        try:
            fits(keep, (B, self.h, T, S), "(B, h, T, S) =")
        except ValueError as err:
            raise ValueError(f"{err}{_mask_hint(tuple(mask.shape), B, T, S)}") from None
        return keep, causal

    def _check_input(self, name, t):
        if not isinstance(t, torch.Tensor):
            tensor(name, t, _positional_hint(name, t))
        if t.dim() != 3 or t.size(-1) != self.d_model:
            raise ValueError(f"{name} must be (B, {'T' if name == 'x' else 'S'}, d_model={self.d_model}), "
                             f"got shape {tuple(t.shape)}{_positional_hint(name, t)}")
        if not t.is_floating_point() or t.layout != torch.strided or t.is_nested:
            raise TypeError(_not_dense_float(name, t))
        weight = self.qkv.weight if type(self.qkv) is nn.Linear else _weight(self.qkv)
        if weight is None:  # hidden by what wraps qkv (dynamic quantization): the module checks its own input
            return
        # Under torch.autocast the projections cast x and the weights to one dtype, so
        # float32 parameters with bfloat16 activations are what mixed precision looks like.
        if t.dtype != weight.dtype and not autocast_casts(t.device.type, t.dtype, weight.dtype):
            raise TypeError(_dtype_advice(name, t, weight))
        if t.device != weight.device:
            raise ValueError(f"{name} is on {t.device} but the module is on {weight.device}; move one of them")


# -- the checks' helpers ------------------------------------------------------------------------------------------


def _check_sizes(d_model, h, n_kv_heads, d_k, p) -> None:
    """The layer's sizes and dropout (d_k None: d_model // h, so h must divide d_model)."""
    check_positive(d_model=d_model, h=h, n_kv_heads=n_kv_heads, **({} if d_k is None else {"d_k": d_k}))
    if d_k is None and d_model % h:
        raise ValueError(
            f"d_model={d_model} is not divisible by h={h}: each head needs d_k = d_model / h "
            f"dimensions (try h in {divisors(d_model)})"
        )
    if h % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide h={h}")
    dropout(p)


def _weight(module):
    """The first floating tensor of a module that wraps a Linear (its dtype and device are the layer's), or None."""
    weight = getattr(module, "weight", None)  # an adapter may forward its base layer's; a quantized one has a method
    if isinstance(weight, torch.Tensor):
        return weight
    return next((t for t in module.parameters() if t.is_floating_point()), None)


def _dtype_advice(name, t, weight):
    message = f"{name} is {t.dtype} but the module's parameters are {weight.dtype}"
    if t.dtype in HALF and weight.dtype == torch.float32:  # autocast never casts float64
        return (
            f"{message}. For {t.dtype} throughout, convert the module: module.to({t.dtype}). For mixed "
            f"precision ({weight.dtype} parameters, {t.dtype} activations), keep the module as it is and run it "
            f"under torch.autocast({t.device.type!r}, dtype={t.dtype})"
        )
    return f"{message}; convert one of them, e.g. module.to({t.dtype}) or {name}.to({weight.dtype})"


def _refuse_cache(context, cache):
    if context is not None:
        raise ValueError("a KVCache is for self-attention decoding; don't pass it with a context")
    raise TypeError(f"cache must be an mha.KVCache, got {type(cache).__name__}")


def _not_dense_float(name, t):
    if t.is_nested:  # PyTorch's variable-length batches: attention here takes a padded batch and a mask
        return (f"{name} is a nested tensor; pass a padded (B, {'T' if name == 'x' else 'S'}, d_model) tensor "
                f"({name}.to_padded_tensor(0.0)) and a padding mask for it (mha.padding_mask(lengths))")
    if t.layout != torch.strided:
        return f"{name} must be a dense tensor, got layout {t.layout}: pass {name}.to_dense()"
    return f"{name} must be a floating tensor, got {t.dtype}"


def _positional_hint(name, t):
    # The article's forward is (x, causal=True): m(x, False) or m(x, mask) lands on context here.
    if name != "context" or isinstance(t, torch.Tensor) and t.dim() == 3 and t.dtype != torch.bool:
        return ""
    return ("; context, the second positional argument, is the sequence that cross-attention reads: pass causal "
            "and mask by name, m(x, causal=False) or m(x, mask=keep)")


def _mask_hint(shape, B, T, S):
    if shape == (B, S):
        return "; a (B, S) padding mask goes in as mask[:, None, None, :]"
    if shape == (B, T, S):
        return "; a per-sample (B, T, S) mask goes in as mask[:, None]"
    if shape == (B, 1, S):
        return "; a (B, 1, S) padding mask goes in as mask[:, None]"
    if shape and shape[-1] != S and S != T:
        return f"; its last dim is the keys: S = {S} here, against T = {T} queries"
    if shape and shape[-1] != S:
        return f"; its last dim is the keys, S = {S} here (for mha.padding_mask(lengths), pass S={S})"
    return ""
