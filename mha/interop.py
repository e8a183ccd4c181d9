"""Copying weights to and from ``torch.nn.MultiheadAttention``.

Both modules keep Q, K and V in one matrix with rows [W_Q; W_K; W_V], each
block (d_model, d_model) in ``nn.Linear``'s (out, in) layout, so the copy is
exact. Masks are another matter: see ``mha.to_torch_attn_mask``.
"""

from __future__ import annotations

import torch
from torch import nn

from .multihead import MultiHeadAttention
from .parameters import check_plain_linears


def from_torch(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """Build an ``mha.MultiHeadAttention`` with a PyTorch module's exact weights.

    The result is batch-first whatever ``module.batch_first`` says, and keeps
    the module's dropout, bias, device and dtype.

    Raises:
        TypeError: ``module`` is not an ``nn.MultiheadAttention``.
        ValueError: the module uses a feature this layer does not have:
            kdim/vdim different from embed_dim (separate q/k/v weights),
            bias_k/bias_v, or add_zero_attn. Copying those would be wrong.
    """
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"from_torch needs an nn.MultiheadAttention, got {type(module).__name__}")
    if not module._qkv_same_embed_dim:
        raise ValueError(
            f"not supported: kdim={module.kdim} / vdim={module.vdim} differ from "
            f"embed_dim={module.embed_dim}; mha keeps Q, K and V in one (3*d_model, d_model) matrix"
        )
    if module.bias_k is not None:
        raise ValueError("not supported: add_bias_kv=True (learned extra key and value)")
    if module.add_zero_attn:
        raise ValueError("not supported: add_zero_attn=True (an extra all-zero key and value)")
    d_model = module.embed_dim
    bias = module.in_proj_bias is not None
    weight = module.in_proj_weight
    m = MultiHeadAttention(
        d_model, module.num_heads, bias=bias, dropout=module.dropout,
        device=weight.device, dtype=weight.dtype,
    )
    with torch.no_grad():
        m.qkv.weight.copy_(weight)
        m.out.weight.copy_(module.out_proj.weight)
        if bias:
            m.qkv.bias.copy_(module.in_proj_bias)
            m.out.bias.copy_(module.out_proj.bias)
    _copy_requires_grad(m, [module.in_proj_weight, module.in_proj_bias, module.out_proj.weight, module.out_proj.bias])
    return m.train(module.training)


def to_torch(m: MultiHeadAttention) -> nn.MultiheadAttention:
    """Build a ``torch.nn.MultiheadAttention(batch_first=True)`` with m's exact weights.

    Call it as ``ref(x, x, x, attn_mask=mha.to_torch_attn_mask(keep),
    average_attn_weights=False)``: PyTorch's boolean mask means True = blocked.

    Raises:
        TypeError: ``m`` is not an ``mha.MultiHeadAttention``.
        ValueError: m uses grouped-query attention (n_kv_heads < h), or heads
            whose total width h * d_k is not d_model, which
            ``nn.MultiheadAttention`` cannot express; or something wraps its
            ``qkv`` or ``out`` (a hook, an adapter, pruning, quantization),
            which copying their weights would leave out.
    """
    if not isinstance(m, MultiHeadAttention):
        raise TypeError(f"to_torch needs an mha.MultiHeadAttention, got {type(m).__name__}")
    if m.n_kv_heads != m.h:
        raise ValueError(
            f"not supported: n_kv_heads={m.n_kv_heads} < h={m.h}; nn.MultiheadAttention has one K/V head per query head"
        )
    if m.h * m.d_k != m.d_model:
        raise ValueError(
            f"not supported: h={m.h} heads of d_k={m.d_k} make {m.h * m.d_k}, not d_model={m.d_model}; "
            "nn.MultiheadAttention's heads always split d_model"
        )
    check_plain_linears(m, "mha.to_torch")
    bias = m.qkv.bias is not None
    weight = m.qkv.weight
    ref = nn.MultiheadAttention(
        m.d_model, m.h, dropout=m.dropout, bias=bias, batch_first=True,
        device=weight.device, dtype=weight.dtype,
    )
    with torch.no_grad():
        ref.in_proj_weight.copy_(weight)
        ref.out_proj.weight.copy_(m.out.weight)
        if bias:
            ref.in_proj_bias.copy_(m.qkv.bias)
            ref.out_proj.bias.copy_(m.out.bias)
    _copy_requires_grad(ref, [m.qkv.weight, m.qkv.bias, m.out.weight, m.out.bias])
    return ref.train(m.training)


def _copy_requires_grad(target, sources):
    # Frozen parameters stay frozen. Both modules list their parameters in the same order:
    # the Q/K/V weight, its bias, W_O, its bias.
    for p, src in zip(target.parameters(), [s for s in sources if s is not None]):
        p.requires_grad_(src.requires_grad)
