"""The multi-head attention layer (Vaswani et al. 2017, §3.2.2): the article's class, grown by what Part 6 teaches.

    head_i = Attention(x W_Q_i, c W_K_i, c W_V_i)      c = x (self-attention) or a context (cross-attention)
    y      = Concat(head_1, ..., head_h) W_O
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from .attention import attend, check_dropout, check_flag, fits
from .masks import as_keep_mask

#: The dtypes attention computes in (float8 has no matmul or softmax).
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class MultiHeadAttention(nn.Module):
    """h attentions in parallel, each on its own d_k-wide projection of the embedding, mixed by W_O.

    The article's class, grown by what Part 6 teaches: masks, cross-attention, the weights or the fused path, and
    dropout. ``qkv``, one ``nn.Linear(d_model, 3 * d_model)``, computes Q, K and V for every head; its rows are
    [W_Q; W_K; W_V], the layout of ``nn.MultiheadAttention.in_proj_weight``. Each of Q, K and V is viewed as
    (B, h, T, d_k): every head still sees the whole embedding, and only the projected vector is split. ``out`` is
    W_O. Both are called as modules on every path, so what wraps them (a hook, a parametrization, LoRA) acts.

    Args:
        d_model: the embedding width; h must divide it, and d_k = d_model / h.
        h: the number of heads.
        bias: whether ``qkv`` and ``out`` have biases.
        dropout: the probability of zeroing an attention weight, in training mode only.
        device, dtype: passed to the parameters.

    The layer holds its weights and nothing else. Its ``state_dict`` records h in its metadata (no tensor, no
    key), and ``load_state_dict`` refuses a state_dict saved from a layer of another h, whose weights would load
    (they have the same shapes for every h) and compute something else (case C19). A dict that lost the metadata
    (rebuilt by a comprehension, or read from safetensors) loads unchecked.

    Raises:
        TypeError: d_model or h is not an int, or dropout is not a number.
        ValueError: h does not divide d_model (names both), a size is not positive, or dropout is not in [0, 1).
    """

    def __init__(self, d_model: int, h: int, *, bias: bool = True, dropout: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_sizes(d_model=d_model, h=h)
        if d_model % h:
            raise ValueError(f"d_model={d_model} is not divisible by h={h}: each head needs d_k = d_model / h "
                             f"dimensions (try h in {[d for d in range(1, min(d_model, 64) + 1) if d_model % d == 0]})")
        check_dropout(dropout)
        d_model, h = int(d_model), int(h)  # (a NumPy integer, say)
        self.d_model, self.h, self.d_k, self.dropout = d_model, h, d_model // h, float(dropout)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias, device=device, dtype=dtype)  # one matrix makes Q, K, V
        self.out = nn.Linear(d_model, d_model, bias=bias, device=device, dtype=dtype)  # W_O
        self.register_state_dict_post_hook(_save_h)
        self.register_load_state_dict_pre_hook(_check_h)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, *, causal: bool | None = None,
                mask: torch.Tensor | None = None, need_weights: bool = True,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from x to itself (or to ``context``), then mix the heads with W_O.

        Args:
            x: (B, T, d_model), float16, bfloat16, float32 or float64.
            context: (B, S, d_model), the sequence the keys and values come from (cross-attention); None means
                self-attention, S = T. It is the second positional argument: pass causal and mask by name.
            causal: query i attends only to keys up to i. None means causal for self-attention and not for
                cross-attention, where x and context are different sequences (so causal=True raises there).
            mask: a keep-mask (True or 1 = may attend) that broadcasts to (B, h, T, S); with ``causal``, a key
                must be allowed by both. A (B, S) padding mask goes in as ``mask[:, None, None, :]``.
            need_weights: True returns the weights; False takes the fused ``F.scaled_dot_product_attention``
                path, which never builds them (see ``mha.scaled_dot_product_attention``).

        Returns:
            ``(y, w)``: y (B, T, d_model), and w the weights (B, h, T, S), one table per head, or None.

        Raises:
            TypeError: x or context is not a dense tensor of a floating dtype above, or a flag is not a bool.
            ValueError: a shape does not fit d_model, the batch or (B, h, T, S) (names them), a mask is not 0/1,
                or causal=True with a context.
        """
        causal, keep = self._check(x, context, causal, mask, need_weights)
        B, T, D = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (B, T, d_model)
        if context is not None:  # cross-attention: keys and values from the context (its queries go unused)
            _, k, v = self.qkv(context).chunk(3, dim=-1)  # each (B, S, d_model)
        split = lambda t: t.view(B, t.size(1), self.h, self.d_k).transpose(1, 2)  # noqa: E731  (B, L, d_model) -> (B, h, L, d_k)
        q, k, v = split(q), split(k), split(v)
        dropout = self.dropout if self.training else 0.0
        o, w = attend(q, k, v, keep, is_causal=causal, dropout_p=dropout, need_weights=need_weights)
        o = o.transpose(1, 2).reshape(B, T, D)  # concatenate the heads: (B, h, T, d_k) -> (B, T, d_model)
        return self.out(o), w

    def _check(self, x, context, causal, mask, need_weights):
        """``forward``'s inputs, checked at the door: (causal, the mask as a bool keep-mask on x's device or None)."""
        self._check_input("x", x)
        if context is not None:
            self._check_input("context", context)
            if context.size(0) != x.size(0):
                raise ValueError(f"context batch {context.size(0)} differs from x batch {x.size(0)}: "
                                 f"x {tuple(x.shape)}, context {tuple(context.shape)}")
        causal = context is None if causal is None else causal
        check_flag("causal", causal)
        check_flag("need_weights", need_weights)
        if causal and context is not None:
            raise ValueError(CAUSAL_WITH_CONTEXT)
        if mask is None:
            return causal, None
        return causal, self._check_mask(mask, x.size(0), x.size(1), (x if context is None else context).size(1),
                                        x.device)

    def _check_mask(self, mask, B, T, S, device):
        """The mask as a bool keep-mask on ``device``, checked to broadcast to (B, h, T, S)."""
        keep = as_keep_mask(mask, device)
        if not fits(keep.shape, (B, self.h, T, S)):
            raise ValueError(_mask_error(tuple(keep.shape), B, self.h, T, S))
        return keep

    def _check_input(self, name, t):
        if not isinstance(t, torch.Tensor) or t.is_nested or t.layout != torch.strided or t.dtype not in DTYPES:
            raise TypeError(_not_dense_float(name, t))
        if t.dim() != 3 or t.size(-1) != self.d_model:
            raise ValueError(f"{name} must be (B, {'T' if name == 'x' else 'S'}, d_model={self.d_model}), "
                             f"got shape {tuple(t.shape)}{_positional_hint(name) if t.dim() != 3 else ''}")

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, h={self.h}, d_k={self.d_k}, dropout={self.dropout}"


def check_sizes(**sizes) -> None:
    """Raise unless every size is a positive integer (a Python or NumPy int; a bool is not one)."""
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {n!r}")
        if n <= 0:
            raise ValueError(f"{name} must be positive, got {n}")


# -- h in the state_dict's metadata (case C19) -------------------------------------------------------------------


def _save_h(module, state_dict, prefix, local_metadata) -> None:
    local_metadata["mha.h"] = module.h  # metadata, not a tensor: no key for to_empty or functional_call to meet


def _check_h(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    saved = local_metadata.get("mha.h")
    for old in ("_extra_state", "head_config"):  # mha 0.4 and 0.3 saved [h, n_kv_heads, d_k] as a tensor
        legacy = state_dict.pop(prefix + old, None)
        if saved is None and isinstance(legacy, torch.Tensor) and legacy.numel() == 3 and not legacy.is_meta:
            saved = int(legacy[0])
    if saved is not None and saved != module.h:
        raise ValueError(f"this state_dict is from a layer with h={saved}, but this layer has h={module.h}: the "
                         "weights would load (their shapes are the same for every h) and compute something else; "
                         f"make the layer with h={saved}")


# -- the errors' messages --------------------------------------------------------------------------------------

CAUSAL_WITH_CONTEXT = ("causal=True with a context: x and context are different sequences, so no key comes 'after' "
                       "a query; leave causal out (or pass False) for cross-attention, and pass a mask to restrict it")


def _positional_hint(name) -> str:
    if name != "context":
        return ""
    # The article's forward is (x, causal=True): m(x, False) or m(x, mask) lands on context.
    return ("; context, the second positional argument, is the sequence that cross-attention reads: pass causal "
            "and mask by name, m(x, causal=False) or m(x, mask=keep)")


def _not_dense_float(name, t) -> str:
    hint = _positional_hint(name)
    if not isinstance(t, torch.Tensor):
        return f"{name} must be a torch.Tensor, got {type(t).__name__}{hint}"
    if t.is_nested:  # PyTorch's variable-length batches: attention here takes a padded batch and a mask
        return (f"{name} is a nested tensor; pass a padded tensor ({name}.to_padded_tensor(0.0)) and a padding mask "
                "for it (mha.padding_mask(lengths))")
    if t.layout != torch.strided:
        return f"{name} must be a dense tensor, got layout {t.layout}: pass {name}.to_dense()"
    return f"{name} must be a floating tensor (float16, bfloat16, float32 or float64), got {t.dtype}{hint}"


def _mask_error(shape, B, h, T, S) -> str:
    message = f"mask of shape {shape} does not broadcast to (B, h, T, S) = {(B, h, T, S)}"
    if shape == (B, S):
        return f"{message}; a (B, S) padding mask goes in as mask[:, None, None, :]"
    if shape == (B, T, S):
        return f"{message}; a per-sample (B, T, S) mask goes in as mask[:, None]"
    if shape == (B, 1, S):
        return f"{message}; a (B, 1, S) padding mask goes in as mask[:, None]"
    if shape and shape[-1] != S and S != T:
        return f"{message}; its last dim is the keys: S = {S} here, against T = {T} queries"
    if shape and shape[-1] != S:
        return f"{message}; its last dim is the keys, S = {S} here (for mha.padding_mask(lengths), pass S={S})"
    return message
