"""The multi-head attention layer (Vaswani et al. 2017, §3.2.2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import checks
from .attention import attend
from .cache import KVCache
from .heads import merge_heads, split_heads


class MultiHeadAttention(nn.Module):
    """h attentions in parallel, each on its own d_k-wide projection, mixed by W_O.

        head_i = Attention(x W_Q_i, c W_K_i, c W_V_i)
        y      = Concat(head_1, ..., head_h) W_O       (Vaswani et al. 2017, §3.2.2)

    One ``nn.Linear`` (``qkv``) computes Q, K and V for every head at once;
    its output is viewed as (B, h, T, d_k). Every head still sees the whole
    embedding: only the *projected* vector is split.

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
        head_config: int64 buffer [h, n_kv_heads, d_k], saved in the
            ``state_dict``. ``load_state_dict`` refuses a state_dict whose
            ``head_config`` differs (strict or not), before copying any weight;
            one without it (mha 0.2, or a dict built by other code) loads as
            before. To load this layer's state_dict into a module that has no
            such buffer, leave the entry out (or pass ``strict=False``).
        qkv: ``nn.Linear(d_model, (h + 2 * n_kv_heads) * d_k)``. Its
            weight rows are [W_Q; W_K; W_V], the layout of
            ``nn.MultiheadAttention.in_proj_weight`` (for n_kv_heads = h and
            the default d_k that is ``nn.Linear(d_model, 3 * d_model)``).
        out: W_O, ``nn.Linear(h * d_k, d_model)``.

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
        checks.layer_sizes(d_model, h, n_kv_heads, d_k, dropout)
        d_k = d_model // h if d_k is None else d_k
        self.d_model, self.h, self.d_k, self.n_kv_heads = d_model, h, d_k, n_kv_heads
        self.dropout = float(dropout)
        self._widths = [h * d_k, n_kv_heads * d_k, n_kv_heads * d_k]  # rows of W_Q, W_K, W_V in qkv
        self.qkv = nn.Linear(d_model, sum(self._widths), bias=bias, device=device, dtype=dtype)
        self.out = nn.Linear(h * d_k, d_model, bias=bias, device=device, dtype=dtype)
        # Saved with the weights, which have the same shapes for any h (and any n_kv_heads with d_k fixed): a
        # checkpoint of another head count would load without a word and compute something else (case C19).
        # An integer tensor, so .half() and .to(dtype) leave it alone.
        self.register_buffer("head_config", torch.tensor([h, n_kv_heads, d_k], device=device))

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
                padding mask (see docs/mask_convention.md).
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
            TypeError: x or context is not a tensor, or (outside autocast) not
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
        keep, causal = checks.layer_inputs(self, x, context, causal, mask, need_weights, cache)  # bool or None; bool
        q, k, v = self._project_heads(x, context)  # (B, h, T, d_k), (B, g, S, d_k), (B, g, S, d_k)
        if cache is not None:
            k, v = cache._extend(k, v, layer=self)  # (B, g, S_cached + T, d_k): every position so far
        out, w = attend(  # (B, h, T, d_k), (B, h, T, S)
            q, k, v, keep,
            is_causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
            enable_gqa=self.n_kv_heads != self.h,
        )
        y = self.out(merge_heads(out))  # (B, T, h*d_k) -> (B, T, d_model)
        if cache is not None:  # stored now that the call succeeded: one that raises leaves the cache as it was
            cache._store(k, v, layer=self)
        return y, w

    def _project_heads(self, x, context):
        """Q from x, K and V from ``context`` (or x), in heads: (B, h, T, d_k), (B, g, S, d_k), (B, g, S, d_k)."""
        g = self.n_kv_heads
        if context is None:
            # qkv's output is Q, K and V side by side, each a whole number of d_k-wide heads,
            # so it splits into h + 2g heads at once: h query heads, then g key and g value heads.
            # (The same views as splitting Q, K, V first, in 3 tensor ops instead of 7.)
            heads = split_heads(self.qkv(x), self.h + 2 * g)  # (B, h + 2g, T, d_k)
            return heads.split_with_sizes([self.h, g, g], dim=1)
        q, k, v = self._project(x, context)  # (B, T, h*d_k), (B, S, g*d_k), (B, S, g*d_k)
        return split_heads(q, self.h), split_heads(k, g), split_heads(v, g)

    def project(
        self, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q from x; K and V from ``context`` (or x). All heads at once, not yet split.

        Returns (B, T, h*d_k), (B, S, n_kv_heads*d_k), (B, S, n_kv_heads*d_k).

        Raises:
            As ``forward`` for x and context.
        """
        checks.layer_inputs(self, x, context)
        return self._project(x, context)

    def _project(self, x, context):
        if context is None:  # self-attention: one matmul for Q, K and V
            return self.qkv(x).split(self._widths, dim=-1)
        W_Q, W_KV = self.qkv.weight.split([self._widths[0], 2 * self._widths[1]])
        b_Q = b_KV = None
        if self.qkv.bias is not None:
            b_Q, b_KV = self.qkv.bias.split([self._widths[0], 2 * self._widths[1]])
        k, v = F.linear(context, W_KV, b_KV).split(self._widths[1:], dim=-1)
        return F.linear(x, W_Q, b_Q), k, v

    @classmethod
    def from_heads(cls, layer: MultiHeadAttention, heads, *, out_bias: bool = True) -> MultiHeadAttention:
        """A new layer holding the query heads ``heads`` of ``layer``, and the K/V heads they use.

        Its weights are copies: the rows of W_Q, W_K and W_V (and of qkv's
        bias) of those heads, and the columns of W_O that multiply their
        outputs. Its head i is ``layer``'s head ``heads[i]``, so its
        ``forward`` returns those heads' weights, in that order, and its output
        is their share of ``layer``'s output:

            layer(x)[0] == sum over a partition of the heads P of
                           from_heads(layer, P, out_bias=False)(x)[0] + layer.out.bias

        which is how tensor parallelism splits a layer (``mha.parallel``).
        d_model, d_k, dropout, device, dtype, training mode and each
        parameter's ``requires_grad`` are kept. Making it draws no random
        numbers.

        Args:
            layer: a ``MultiHeadAttention``.
            heads: a range or sequence of distinct query-head indices in
                [0, layer.h). With grouped-query attention (query head i uses
                K/V head i // (h / n_kv_heads)) the chosen heads must make a
                layer of their own: the heads of each K/V head they use side
                by side, equally many for each, e.g. ``range(0, h // 2)``.
            out_bias: False gives ``out`` no bias, so that partial outputs
                can be summed and W_O's bias added once after the sum.

        Returns:
            A ``MultiHeadAttention`` with h = len(heads), n_kv_heads = the
            number of K/V heads used, and the same d_k.

        Raises:
            TypeError: ``layer`` is not a ``MultiHeadAttention``, ``heads``
                is not a range or sequence (a single int, say), or a head
                index is not an int (bools are refused too).
            ValueError: no heads, a head out of range or given twice, or
                heads that do not make a whole set of K/V heads (names them).
        """
        h_ids, kv_ids = checks.chosen_heads(layer, heads, MultiHeadAttention)
        weight, d_k = layer.qkv.weight, layer.d_k
        has_bias = layer.qkv.bias is not None
        # Built on the meta device and then given uninitialised memory: no random initialisation,
        # so making a layer from heads does not move the random number generator.
        new = cls(
            layer.d_model, len(h_ids), n_kv_heads=len(kv_ids), d_k=d_k, bias=has_bias,
            dropout=layer.dropout, device="meta", dtype=weight.dtype,
        )
        out_has_bias = out_bias and layer.out.bias is not None
        if (new.out.bias is not None) != out_has_bias:  # W_O's bias: kept, or left to add once after a sum
            new.out = nn.Linear(len(h_ids) * d_k, layer.d_model, bias=out_has_bias, device="meta", dtype=weight.dtype)
        new.to_empty(device=weight.device)
        rows, cols = _qkv_rows(layer, h_ids, kv_ids), _columns(h_ids, d_k)
        with torch.no_grad():
            new.qkv.weight.copy_(weight[rows.to(weight.device)])
            if has_bias:
                new.qkv.bias.copy_(layer.qkv.bias[rows.to(weight.device)])
            new.out.weight.copy_(layer.out.weight[:, cols.to(weight.device)])
            if new.out.bias is not None:
                new.out.bias.copy_(layer.out.bias)
            new.head_config.copy_(torch.tensor([new.h, new.n_kv_heads, new.d_k]))  # to_empty left it unset
        for mine, theirs in ((new.qkv.weight, weight), (new.qkv.bias, layer.qkv.bias),
                             (new.out.weight, layer.out.weight), (new.out.bias, layer.out.bias)):
            if mine is not None:
                mine.requires_grad_(theirs.requires_grad)  # frozen stays frozen
        return new.train(layer.training)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "head_config"
        checks.checkpoint_heads(self, state_dict.get(key))  # before any of this layer's weights are copied
        # Matching, or not saved (a state_dict of mha 0.2): the layer's own counts load. load_state_dict hands each
        # module a copy of the dict to change; a fresh tensor also mends one that to_empty() left unset.
        state_dict[key] = torch.tensor([self.h, self.n_kv_heads, self.d_k], device=self.head_config.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        kv = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.h else ""
        return f"d_model={self.d_model}, h={self.h}, d_k={self.d_k}{kv}, dropout={self.dropout}"


def _qkv_rows(layer, h_ids, kv_ids):
    """Rows of layer.qkv for the chosen heads: [W_Q rows of h_ids; W_K rows of kv_ids; W_V rows of kv_ids]."""
    d_k, k_start, v_start = layer.d_k, layer._widths[0], layer._widths[0] + layer._widths[1]
    return torch.cat([
        _columns(h_ids, d_k),
        k_start + _columns(kv_ids, d_k),
        v_start + _columns(kv_ids, d_k),
    ])


def _columns(ids, d_k):
    """Indices i*d_k ... (i+1)*d_k - 1 of each head i, in order: head i's slice of a (.., h*d_k) dim."""
    return (torch.tensor(ids, dtype=torch.long)[:, None] * d_k + torch.arange(d_k)).flatten()
