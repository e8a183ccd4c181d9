"""Checks of ``MultiHeadAttention``: its sizes, its inputs, the heads of ``from_heads``, checkpoints, and interop."""

from __future__ import annotations

import operator

import torch

from ..precision import HALF, autocast_casts
from .masks import fits, keep_mask
from .values import check_positive, divisors, dropout, flags, sequence, tensor


def layer_sizes(d_model, h, n_kv_heads, d_k, p) -> None:
    """``MultiHeadAttention``'s sizes and dropout (d_k None: d_model // h, so h must divide d_model)."""
    check_positive(d_model=d_model, h=h, n_kv_heads=n_kv_heads, **({} if d_k is None else {"d_k": d_k}))
    if d_k is None and d_model % h:
        raise ValueError(
            f"d_model={d_model} is not divisible by h={h}: each head needs d_k = d_model / h "
            f"dimensions (try h in {divisors(d_model)})"
        )
    if h % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide h={h}")
    dropout(p)


def layer_inputs(layer, x, context=None, causal=None, mask=None, need_weights=True, cache=None):
    """``MultiHeadAttention.forward``'s inputs, checked: (the mask as a bool keep-mask on x's device, or None;
    whether the attention is causal, None meaning "for self-attention").

    Checks everything before the call changes anything (the cache, say): x and context
    (shape, dtype, device), the flags, the cache's type, dropout when it is used, and the mask
    against (B, h, T, S), where S counts the cached positions too. It runs on every call, one
    decoding step included, so the common case takes the fewest Python operations.
    """
    _layer_input(layer, "x", x)
    if context is not None:
        _layer_input(layer, "context", context)
        if context.size(0) != x.size(0):
            raise ValueError(
                f"context batch {context.size(0)} differs from x batch {x.size(0)}: "
                f"x {tuple(x.shape)}, context {tuple(context.shape)}"
            )
    if causal is None:
        causal = context is None  # causal self-attention; cross-attention has no order between x and context
    elif type(causal) is not bool:
        flags(causal=causal)
    elif causal and context is not None:
        raise ValueError(
            "causal=True with a context: x and context are different sequences, so no key comes 'after' a query; "
            "leave causal out (or pass False) for cross-attention, and pass a mask to restrict it"
        )
    if type(need_weights) is not bool:
        flags(need_weights=need_weights)
    if cache is not None and (context is not None or not hasattr(cache, "reset")):
        _layer_cache(context, cache)  # raises
    if layer.training:
        dropout(layer.dropout)  # checked when the layer was made, but an attribute can be changed since
    if mask is None:
        return None, causal
    B, T, S = x.size(0), x.size(1), (x if context is None else context).size(1)
    if cache is not None:
        S += len(cache)  # the new queries attend to the cached keys too
    tensor("mask", mask)
    try:
        fits(mask, (B, layer.h, T, S), "(B, h, T, S) =")
    except ValueError as err:
        if tuple(mask.shape) == (B, S):
            raise ValueError(f"{err}; a (B, S) padding mask goes in as mask[:, None, None, :]") from None
        if tuple(mask.shape) == (B, T, S):
            raise ValueError(f"{err}; a per-sample (B, T, S) mask goes in as mask[:, None]") from None
        raise
    return keep_mask(mask, device=x.device), causal


def _layer_input(layer, name, t):
    if not isinstance(t, torch.Tensor):
        tensor(name, t)
    if t.dim() != 3 or t.size(-1) != layer.d_model:
        length = "T" if name == "x" else "S"
        raise ValueError(f"{name} must be (B, {length}, d_model={layer.d_model}), got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
    weight = layer.qkv.weight
    # Under torch.autocast the projections cast x and the weights to one dtype, so
    # float32 parameters with bfloat16 activations are what mixed precision looks like.
    if t.dtype != weight.dtype and not autocast_casts(t.device.type, t.dtype, weight.dtype):
        raise TypeError(_dtype_advice(name, t, weight))
    if t.device != weight.device:
        raise ValueError(f"{name} is on {t.device} but the module is on {weight.device}; move one of them")


def _dtype_advice(name, t, weight):
    message = f"{name} is {t.dtype} but the module's parameters are {weight.dtype}"
    if t.dtype in HALF and weight.dtype == torch.float32:  # autocast never casts float64
        return (
            f"{message}. For {t.dtype} throughout, convert the module: module.to({t.dtype}). For mixed "
            f"precision ({weight.dtype} parameters, {t.dtype} activations), keep the module as it is and run it "
            f"under torch.autocast({t.device.type!r}, dtype={t.dtype})"
        )
    return f"{message}; convert one of them, e.g. module.to({t.dtype}) or {name}.to({weight.dtype})"


def _layer_cache(context, cache):
    if context is not None:
        raise ValueError("a KVCache is for self-attention decoding; don't pass it with a context")
    # Known by what the layer uses of it, so that this module need not import mha.cache.
    if not (hasattr(cache, "update") and hasattr(cache, "reset")):
        raise TypeError(f"cache must be an mha.KVCache, got {type(cache).__name__}")


def chosen_heads(layer, heads, layer_type) -> tuple[list[int], list[int]]:
    """``MultiHeadAttention.from_heads``'s heads: (query heads, the K/V heads they use), checked to make a layer."""
    if not isinstance(layer, layer_type):
        raise TypeError(f"from_heads needs an mha.MultiHeadAttention, got {type(layer).__name__}")
    h_ids = [_head_index(i) for i in sequence("heads", heads, "a range or sequence of query-head indices")]
    if not h_ids:
        raise ValueError("from_heads needs at least one head")
    if len(set(h_ids)) < len(h_ids) or not all(0 <= i < layer.h for i in h_ids):
        raise ValueError(f"heads must be distinct indices in [0, h={layer.h}), got {h_ids}")
    per_kv = layer.h // layer.n_kv_heads
    used = [i // per_kv for i in h_ids]  # the K/V head each chosen query head uses
    kv_ids = list(dict.fromkeys(used))
    # The new layer's query head j uses its K/V head j // (h' / g'): the chosen heads must come
    # in runs, one per K/V head, all of one length.
    if len(h_ids) % len(kv_ids) or used != [kv for kv in kv_ids for _ in range(len(h_ids) // len(kv_ids))]:
        raise ValueError(
            f"heads {h_ids} use K/V heads {used} (query head i uses K/V head i // {per_kv}); a layer needs "
            "the query heads of each K/V head it uses side by side, equally many for each"
        )
    return h_ids, kv_ids


def _head_index(i) -> int:
    """An int head index (a 0-dim integer tensor counts); not a float, nor a bool (True would be head 1)."""
    if not isinstance(i, bool):
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise TypeError(f"head indices must be ints, got {i!r}")


def checkpoint_heads(layer, saved) -> None:
    """Raise unless a state_dict's ``head_config`` (None: not saved, as by mha 0.2) holds the layer's head counts.

    It may come back in another dtype (``{k: v.half() for k, v in sd.items()}``): the layer's counts are
    compared after the same conversion.
    """
    if saved is None:
        return
    names, mine = ("h", "n_kv_heads", "d_k"), [layer.h, layer.n_kv_heads, layer.d_k]
    if not isinstance(saved, torch.Tensor) or saved.shape != (3,):
        shown = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
        raise ValueError(f"the state_dict's head_config must be a tensor [h, n_kv_heads, d_k], got {shown}")
    if saved.is_meta:  # no values to compare (and no weights to copy)
        return
    saved = saved.detach().cpu()
    if not torch.equal(torch.tensor(mine).to(saved.dtype), saved):
        theirs = ", ".join(f"{name}={n:g}" for name, n in zip(names, saved.tolist()))
        raise ValueError(
            f"this state_dict is from a layer with {theirs}, but this layer has "
            f"{', '.join(f'{name}={n}' for name, n in zip(names, mine))}: the weights would load (their shapes can "
            "match) and compute something else; make the layer with the checkpoint's sizes"
        )


def torch_module(module) -> None:
    """An ``nn.MultiheadAttention`` whose features ``mha.from_torch`` can copy exactly."""
    if not isinstance(module, torch.nn.MultiheadAttention):
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


def torch_compatible(m, layer_type) -> None:
    """An ``mha.MultiHeadAttention`` that ``nn.MultiheadAttention`` can express (``mha.to_torch``)."""
    if not isinstance(m, layer_type):
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


def module(name: str, m) -> None:
    if not isinstance(m, torch.nn.Module):
        raise TypeError(f"{name} needs an nn.Module, got {type(m).__name__}")
