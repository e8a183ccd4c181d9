"""Every input check of mha's public functions, in one place.

The lesson modules (attention, multihead, heads, masks, cache) do the maths and raise
nothing. Each public function, and ``MultiHeadAttention.forward``, first calls a check from
here: it raises a ValueError or TypeError that names the offending shapes or values, and
hands back the inputs in the form the maths wants (a mask as a bool keep-mask, say).

Sizes may be symbolic: under ``torch.compile``, ``torch.export`` and ``torch.jit.trace`` a
tensor's sizes are ``torch.SymInt`` or 0-dim tensors, which the checks accept as ints.
"""

from __future__ import annotations

import itertools
import numbers
import operator

import torch

from .precision import HALF, autocast_casts, autocast_inputs

_CONVENTION = "mha masks are keep-masks: True or 1 = this query may attend to this key, False or 0 = blocked"

# -- numbers and sizes -------------------------------------------------------------------------------------


def is_int(n) -> bool:
    """Whether ``n`` is an integer size: an int, a ``torch.SymInt``, or (while tracing) a 0-dim integer tensor."""
    if isinstance(n, bool):
        return False
    if isinstance(n, (numbers.Integral, torch.SymInt)):
        return True
    return (
        torch.jit.is_tracing()
        and isinstance(n, torch.Tensor)
        and n.dim() == 0
        and not (n.is_floating_point() or n.is_complex() or n.dtype == torch.bool)
    )


def check_int(**sizes) -> None:
    """Raise TypeError unless every size is an integer (see :func:`is_int`; bools don't count)."""
    for name, n in sizes.items():
        if not is_int(n):
            raise TypeError(f"{name} must be an int, got {n!r}")


def check_positive(**sizes) -> None:
    """Raise unless every size is a positive integer."""
    check_int(**sizes)
    for name, n in sizes.items():
        if n <= 0:
            raise ValueError(f"{name} must be positive, got {n}")


def divisors(n: int, limit: int = 64) -> list[int]:
    """The divisors of n up to ``limit``: what to suggest when a size must divide n."""
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def broadcast_shapes(*shapes) -> torch.Size:
    """``torch.broadcast_shapes(*shapes)``, cheap when every size is a plain int.

    ``torch.broadcast_shapes`` reasons about symbolic sizes even in eager mode, which costs
    about 20 us a call on a CPU: more than one decoding step of a small model. Plain int
    sizes need only the rule (aligned from the right, sizes equal or 1).

    Raises:
        RuntimeError: the shapes do not broadcast (as ``torch.broadcast_shapes``).
    """
    symbolic = torch.compiler.is_compiling() or torch.jit.is_tracing()  # (dynamo shows SymInts as ints)
    if symbolic or not all(type(n) is int for shape in shapes for n in shape):
        return torch.broadcast_shapes(*shapes)
    result = []
    for sizes in itertools.zip_longest(*(reversed(shape) for shape in shapes), fillvalue=1):
        not_one = set(sizes) - {1}
        if len(not_one) > 1:
            raise RuntimeError(f"shapes {[tuple(shape) for shape in shapes]} do not broadcast")
        result.append(not_one.pop() if not_one else 1)
    return torch.Size(reversed(result))


def dropout(p) -> None:
    """Raise unless ``p`` is a real number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout must be a number in [0, 1), got {p!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")


def flags(**values) -> None:
    """Raise TypeError unless every flag is a bool (a mask passed as is_causal, say)."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {type(value).__name__}")


def tensor(name: str, t) -> None:
    """Raise TypeError unless ``t`` is a tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


# -- masks -------------------------------------------------------------------------------------------------


def keep_mask(mask, device=None) -> torch.Tensor:
    """``mask`` checked to be a 0/1 keep-mask, as a bool tensor on ``device`` (see ``mha.as_keep_mask``)."""
    tensor("mask", mask)
    if mask.dtype.is_complex:
        raise TypeError(f"mask must be bool, integer or float, got {mask.dtype}")
    mask = mask.detach().to(device) if device is not None else mask.detach()
    if mask.dtype == torch.bool:
        return mask
    is_binary = (mask == 0) | (mask == 1)
    if not bool(is_binary.all()):
        bad = sorted({str(v) for v in mask[~is_binary].tolist()})[:4]
        hint = ""
        if mask.is_floating_point() and bool((mask < 0).any()):
            hint = (" It looks like an additive mask (0 = attend, -inf = blocked); "
                    "convert it with `keep = (additive_mask == 0)`.")
        raise ValueError(
            f"{mask.dtype} mask holds values other than 0 and 1 (e.g. {', '.join(bad)}). {_CONVENTION}.{hint}"
        )
    if mask.is_floating_point() and mask.numel() and not bool(mask.any()):
        # As a keep-mask it blocks every key, which nobody means; as an additive mask it blocks nothing.
        raise ValueError(
            f"float mask of shape {tuple(mask.shape)} is all zeros, which as a keep-mask blocks every key. "
            f"{_CONVENTION}. If it is an additive mask with nothing blocked, pass mask=None "
            "(or a bool mask: `keep = (additive_mask == 0)`)."
        )
    return mask.bool()


def fits(mask: torch.Tensor, target: tuple, names: str = "") -> None:
    """Raise ValueError unless ``mask`` broadcasts to ``target`` without growing it."""
    try:
        ok = tuple(broadcast_shapes(mask.shape, target)) == tuple(target)
    except RuntimeError:
        ok = False
    if not ok:
        where = f" {names}" if names else ""
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to{where} {tuple(target)}")


def causal_lengths(T, S) -> None:
    """Sizes of ``mha.causal_mask``: ints (symbolic ones too), not negative."""
    check_int(T=T, S=S)
    if T < 0 or S < 0:
        raise ValueError(f"causal_mask needs T >= 0 and S >= 0, got T={T}, S={S}")


def padding_lengths(lengths, S) -> tuple[list[int], int]:
    """``mha.padding_mask``'s lengths as a list of ints, checked against S (default: the longest)."""
    if not isinstance(lengths, torch.Tensor):
        if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in lengths):
            raise TypeError(f"lengths must be integers, got {list(lengths)}")
        lengths = torch.tensor(list(lengths), dtype=torch.long)
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be integers, got {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    values = lengths.tolist()
    S = max(values, default=0) if S is None else S
    check_int(S=S)
    if values and (min(values) < 0 or max(values) > S):
        raise ValueError(f"every length must be in [0, S={S}], got {values}")
    return values, S


def torch_attn_mask(mask, shape) -> torch.Tensor:
    """``mha.to_torch_attn_mask``'s mask as a bool keep-mask, checked to fit ``shape`` (or be 2-D without it)."""
    keep = keep_mask(mask)
    if shape is None and keep.dim() != 2:
        raise ValueError(
            f"a {keep.dim()}-D mask of shape {tuple(keep.shape)} needs shape=(B, h, T, S) "
            "to become nn.MultiheadAttention's (B*h, T, S) attn_mask"
        )
    if shape is not None:
        fits(keep, tuple(shape))
    return keep


def additive_mask(mask, dtype) -> torch.Tensor:
    """``mha.to_additive_mask``'s mask as a bool keep-mask; ``dtype`` must be floating."""
    if not dtype.is_floating_point:
        raise TypeError(f"an additive mask must be floating, got dtype={dtype}")
    return keep_mask(mask)


# -- heads -------------------------------------------------------------------------------------------------


def split_heads(x, h) -> None:
    if h.__class__ is not int or h <= 0:
        check_positive(h=h)
    if not isinstance(x, torch.Tensor):
        tensor("x", x)
    if x.dim() != 3 or x.size(-1) % h:
        raise ValueError(f"split_heads needs (B, T, h*d_k) with h={h}, got shape {tuple(x.shape)}")


def merge_heads(x) -> None:
    if not isinstance(x, torch.Tensor):
        tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"merge_heads needs (B, h, T, d_k), got shape {tuple(x.shape)}")


# -- scaled_dot_product_attention -----------------------------------------------------------------------


def attention_inputs(q, k, v, mask, is_causal, dropout_p, need_weights, enable_gqa):
    """``mha.scaled_dot_product_attention``'s inputs, checked: (q, k, v, keep).

    Under an active autocast q, k and v come back in its dtype (as its matmuls would cast
    them), and the mask as a bool keep-mask on q's device, or None.
    """
    q, k, v = autocast_inputs(q, k, v)  # a no-op outside torch.autocast
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must be at least 2-D (..., length, dim), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them to one, "
            "or run under torch.autocast for mixed precision"
        )
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.size(-1) == 0:
        raise ValueError(f"d_k must be positive, got q of shape {tuple(q.shape)}")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k need the same last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v need the same length S (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    flags(is_causal=is_causal, need_weights=need_weights, enable_gqa=enable_gqa)
    batch = _attention_batch(q, k, v, enable_gqa)
    dropout(dropout_p)
    if mask is None:
        return q, k, v, None
    keep = keep_mask(mask, device=q.device)
    fits(keep, (*batch, q.size(-2), k.size(-2)), "(..., T, S) =")
    return q, k, v, keep


def _attention_batch(q, k, v, enable_gqa):
    """The leading dims of the scores (..., T, S), checked to broadcast (with enable_gqa, q's heads included)."""
    if enable_gqa:
        if q.dim() < 3 or k.dim() < 3 or k.shape != v.shape[:-1] + k.shape[-1:]:
            raise ValueError(
                f"enable_gqa needs q (..., h, T, d_k) and k, v (..., g, S, d), got "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        if k.size(-3) == 0 or q.size(-3) % k.size(-3):
            raise ValueError(f"enable_gqa needs the K/V heads g={k.size(-3)} to divide the query heads h={q.size(-3)}")
        batch_dims = (q.shape[:-3], k.shape[:-3])
    else:
        batch_dims = (q.shape[:-2], k.shape[:-2], v.shape[:-2])
    try:
        batch = broadcast_shapes(*batch_dims)
    except RuntimeError:
        raise ValueError(
            f"leading dims of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not broadcast"
            + ("" if enable_gqa else " (for fewer K/V heads than query heads pass enable_gqa=True)")
        ) from None
    return (*batch, q.size(-3)) if enable_gqa else tuple(batch)


# -- MultiHeadAttention ------------------------------------------------------------------------------------


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


def layer_inputs(layer, x, context=None, causal=True, mask=None, need_weights=True, cache=None):
    """``MultiHeadAttention.forward``'s inputs, checked: the mask as a bool keep-mask on x's device, or None.

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
    if causal.__class__ is not bool or need_weights.__class__ is not bool:
        flags(causal=causal, need_weights=need_weights)
    if cache is not None and (context is not None or cache.__class__ not in _CACHE_TYPES):
        _layer_cache(context, cache)
    if layer.training:
        dropout(layer.dropout)  # checked when the layer was made, but an attribute can be changed since
    if mask is None:
        return None
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
    return keep_mask(mask, device=x.device)


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


_CACHE_TYPES = set()  # classes already seen to be caches


def _layer_cache(context, cache):
    if context is not None:
        raise ValueError("a KVCache is for self-attention decoding; don't pass it with a context")
    # Known by what the layer uses of it, so that this module need not import mha.cache.
    if not all(hasattr(cache, name) for name in ("update", "reset", "__len__")):
        raise TypeError(f"cache must be an mha.KVCache, got {type(cache).__name__}")
    _CACHE_TYPES.add(cache.__class__)


def chosen_heads(layer, heads, layer_type) -> tuple[list[int], list[int]]:
    """``MultiHeadAttention.from_heads``'s heads: (query heads, the K/V heads they use), checked to make a layer."""
    if not isinstance(layer, layer_type):
        raise TypeError(f"from_heads needs an mha.MultiHeadAttention, got {type(layer).__name__}")
    h_ids = []
    for i in heads:
        try:
            h_ids.append(operator.index(i))  # ints and 0-dim integer tensors; not floats
        except TypeError:
            raise TypeError(f"head indices must be ints, got {i!r}") from None
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


def checkpoint_heads(layer, saved: dict) -> None:
    """Raise unless the head counts a state_dict recorded (if any: mha 0.2 recorded none) are the layer's."""
    mine = {"h": layer.h, "n_kv_heads": layer.n_kv_heads, "d_k": layer.d_k}
    theirs = {name: saved[name] for name in mine if name in saved}
    if any(theirs[name] != mine[name] for name in theirs):
        show = ", ".join(f"{name}={n}" for name, n in theirs.items())
        raise ValueError(
            f"this state_dict is from a layer with {show}, but this layer has "
            f"{', '.join(f'{name}={mine[name]}' for name in theirs)}: the weights would load (their shapes can "
            "match) and compute something else; make the layer with the checkpoint's sizes"
        )


# -- KVCache -----------------------------------------------------------------------------------------------


def cache_max_len(max_len) -> None:
    if max_len is not None:
        check_positive(max_len=max_len)


def cache_update(cache, k, v, layer) -> None:
    """New keys and values that fit what the cache holds (batch, heads, d_k, dtype, device) and its max_len,
    from the layer that owns the cache (if it has one yet)."""
    owner = cache._layer
    if layer is not None and owner is not None and owner is not layer:
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
        beams = list(beams)
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


# -- interop and counting ----------------------------------------------------------------------------------


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
