"""PyTorch's ``nn.MultiheadAttention`` and mask conventions: weights copied both ways, masks converted.

Both modules keep Q, K and V in one matrix with rows [W_Q; W_K; W_V], each block (d_model, d_model) in
``nn.Linear``'s (out, in) layout, so the copy is exact (case C9). Masks are another matter: ``nn.MultiheadAttention``
reads a bool mask as True = *blocked*, and both it and ``F.scaled_dot_product_attention`` add a float mask to the
scores. :func:`to_torch_attn_mask` and :func:`to_additive_mask` convert a keep-mask for them (cases C1-C3).
"""

from __future__ import annotations

import torch
from torch import nn

from .masks import as_keep_mask
from .multihead import MultiHeadAttention


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
    if type(module).forward is not nn.MultiheadAttention.forward:  # computes with weights of its own (quantizable)
        raise ValueError(f"not supported: {type(module).__module__}.{type(module).__qualname__} computes with its own "
                         "weights, not in_proj_weight, so copying in_proj_weight would give another layer")
    if module.kdim != module.embed_dim or module.vdim != module.embed_dim:
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
        ValueError: m is an ``mha.GroupedQueryAttention`` with n_kv_heads < h, or heads
            whose total width h * d_k is not d_model, which
            ``nn.MultiheadAttention`` cannot express; or something wraps its
            ``qkv`` or ``out`` (a hook, an adapter, pruning, quantization),
            which copying their weights would leave out.
    """
    if not isinstance(m, MultiHeadAttention):
        raise TypeError(f"to_torch needs an mha.MultiHeadAttention, got {type(m).__name__}")
    if getattr(m, "n_kv_heads", m.h) != m.h:  # a GroupedQueryAttention with fewer K/V heads
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
    if bias != (m.out.bias is not None):  # nn.MultiheadAttention has both biases or neither
        raise ValueError(f"not supported: qkv {'has' if bias else 'has no'} bias but out "
                         f"{'has none' if bias else 'has one'}; nn.MultiheadAttention(bias=...) sets both")
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


def check_plain_linears(layer, path: str) -> None:
    """Raise unless ``layer.qkv`` and ``layer.out`` are plain ``nn.Linear`` modules with no hooks.

    ``path`` copies their weights rather than calling them, so it cannot apply what wraps them (case C23): an
    adapter module (LoRA), a subclass with its own forward, dynamic quantization, a forward hook or pruning
    (a hook too). A parametrization acts on the weight itself, so its weight is copied as it computes it.
    """
    for name in ("qkv", "out"):
        module = getattr(layer, name)
        if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
            if not (module._forward_hooks or module._forward_pre_hooks):
                continue
            what = "has forward hooks (torch.nn.utils.prune adds one)"
        else:
            what = f"is a {type(module).__module__}.{type(module).__qualname__}, not an nn.Linear"
        raise ValueError(
            f"{path} copies the weights of {name} instead of calling it, so it cannot apply what wraps it: "
            f"{name} {what}. Remove the wrapper first (merge an adapter into the weights, "
            "torch.nn.utils.prune.remove() a pruning), or call the layer itself"
        )


def to_torch_attn_mask(mask: torch.Tensor, shape: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Convert a keep-mask into ``nn.MultiheadAttention``'s ``attn_mask``, where True means *blocked*.

    Passing a keep-mask such as ``tril(ones)`` straight to ``nn.MultiheadAttention`` makes every query attend only
    to the future, and its last row NaN (case C1). This inverts it, in the shape that module accepts.

    Args:
        mask: a keep-mask (see :func:`mha.as_keep_mask`): (T, S) without ``shape``, else anything that broadcasts
            to ``shape``.
        shape: (B, h, T, S) of the attention it is meant for, needed for per-sample or per-head masks, which
            PyTorch wants as (B*h, T, S).

    Returns:
        A bool tensor, True = blocked: (T, S) without ``shape``, else (B*h, T, S).

    Raises:
        TypeError: a size in ``shape`` is not an int.
        ValueError: the mask is not 2-D and no ``shape`` was given, ``shape`` is not four sizes, or the mask does
            not broadcast to it.
    """
    keep = as_keep_mask(mask)
    if shape is None:
        if keep.dim() != 2:
            raise ValueError(f"a {keep.dim()}-D mask of shape {tuple(keep.shape)} needs shape=(B, h, T, S) to become "
                             "nn.MultiheadAttention's (B*h, T, S) attn_mask")
        return ~keep
    if isinstance(shape, (str, bytes, torch.Tensor)) or not hasattr(shape, "__len__") or len(shape) != 4:
        raise ValueError(f"shape must be (B, h, T, S), four sizes, got {shape!r}")
    for name, n in zip(("B", "h", "T", "S"), shape):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"shape's {name} must be an int, got {n!r}")
    B, h, T, S = shape
    try:
        return ~keep.expand(B, h, T, S).reshape(B * h, T, S)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(keep.shape)} does not broadcast to {tuple(shape)}") from None


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Convert a keep-mask into an additive float mask of the same shape: 0 = attend, -inf = blocked.

    This is what ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` make of a *float* mask: they add
    it to the scores before the softmax.

    Raises:
        TypeError: ``dtype`` is not a floating ``torch.dtype`` (a string such as ``"float32"``, say).
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {type(dtype).__name__} {dtype!r}")
    if not dtype.is_floating_point:
        raise TypeError(f"an additive mask must be floating, got dtype={dtype}")
    keep = as_keep_mask(mask)
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))
