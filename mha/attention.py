"""Scaled dot-product attention, the operation every head runs (Part 5).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V      (Vaswani et al. 2017, §3.2.1)

Two paths give the same numbers:

* the explicit path builds the (T, S) weights table, so you can look at it;
* the fused path (``need_weights=False``) hands the work to
  ``torch.nn.functional.scaled_dot_product_attention``, which picks a flash or
  memory-efficient kernel and never builds that table.

They also give the same derivatives, of every order and mode (see ``_fused``).
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils.checkpoint import CheckpointError

from .masks import _causal_mask, as_keep_mask
from .precision import HALF, autocast_dtype, autocast_inputs
from .values import broadcast, dropout, fits, flags, tensor


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = True,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * scale) v, with masks in the library's keep convention.

    Shapes (any leading dims ``...`` that broadcast):
        q (..., T, d_k), k (..., S, d_k), v (..., S, d_v)
        -> out (..., T, d_v), weights (..., T, S).

    Args:
        q, k, v: floating tensors of one dtype, on one device.
        mask: keep-mask (True/1 = may attend, False/0 = blocked) that
            broadcasts to (..., T, S); bool, integer or float 0/1. It is moved
            to q's device.
        is_causal: query i may attend to keys up to position i, aligned
            bottom-right: with T < S the queries are the last T positions
            (decoding against cached keys). Combines with ``mask`` (both must
            allow a key).
        scale: multiplies the scores; default ``1 / sqrt(d_k)``. A finite
            number.
        dropout_p: probability of zeroing an attention weight. Applied
            whenever it is > 0: the caller decides (a module passes 0 in eval).
        need_weights: False takes the fused path through
            ``F.scaled_dot_product_attention`` and returns ``weights=None``.
            Both paths give the same numbers under every kind of
            differentiation: reverse mode of any order (``create_graph=True``,
            ``gradgradcheck``), forward mode (``torch.func.jvp``, ``jacfwd``,
            ``hessian``) and ``torch.func`` transforms (``vmap`` of ``grad``).
            PyTorch's fused kernels have a first derivative only, so there
            the fused path routes around them: a second derivative goes
            through PyTorch's math kernel, forward mode and ``torch.func``
            through the explicit path's code (the compatibility page:
            https://transformer-on-ramp.github.io/mha/compatibility.html).
        enable_gqa: grouped-query attention: k and v have g heads in dim -3,
            q has h, and g divides h. Query head i uses K/V head i // (h/g).

    Returns:
        ``(out, weights)``. Without dropout each row of ``weights`` sums to 1,
        except a query whose keys are all blocked: its weights and its output
        are zero (never NaN, in the forward pass or in gradients, whatever
        that query holds). A key and value that the mask blocks for every
        query never reach the output or the gradients, even when they hold inf
        or NaN (padding an earlier layer left garbage in;
        ``F.scaled_dot_product_attention`` returns NaN there).
        float16/bfloat16 inputs compute scores and softmax in float32, so
        large logits stay finite; out and weights come back in q's dtype.
        Under an active ``torch.autocast`` q, k and v are first cast to its
        dtype, as its matmuls would cast them (so they may arrive in different
        dtypes, as ``F.scaled_dot_product_attention`` allows there); scores and
        softmax still run in float32.

    Raises:
        TypeError: an input is not a floating tensor, dtypes differ
            (outside autocast), or scale is not a number.
        ValueError: shapes don't fit together (names them), the mask does not
            broadcast or is not 0/1, scale is not finite, or dropout_p is
            outside [0, 1).
        RuntimeError: a second derivative on the fused path with dropout
            on a GPU kernel, whose dropout cannot be replayed (use
            ``need_weights=True``).

    See the PyTorch doc of ``torch.nn.functional.scaled_dot_product_attention``;
    its boolean masks use the same convention, but its float masks are
    additive and its ``is_causal`` aligns top-left.
    """
    q, k, v, keep = _check_inputs(q, k, v, mask, is_causal, scale, dropout_p, need_weights, enable_gqa)
    return attend(q, k, v, keep, is_causal, scale, dropout_p, need_weights, enable_gqa)


def _check_inputs(q, k, v, mask, is_causal, scale, dropout_p, need_weights, enable_gqa):
    """The inputs, checked: (q, k, v, keep). Under an active autocast q, k and v come back in its dtype (as its
    matmuls would cast them), and the mask as a bool keep-mask on q's device, or None."""
    passed = [getattr(t, "dtype", None) for t in (q, k, v)]  # as given: the message names these, not autocast's
    q, k, v = autocast_inputs(q, k, v)  # a no-op outside torch.autocast
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must be at least 2-D (..., length, dim), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        active = autocast_dtype(q.device.type)
        advice = "cast them to one, or run under torch.autocast for mixed precision"
        if active is not None:  # it cast the others to its dtype; it never casts float64
            advice = f"torch.autocast casts the others to {active} but never float64: cast those to float32"
        raise TypeError(f"q, k, v must share a dtype, got {', '.join(map(str, passed))}; {advice}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.size(-1) == 0:
        raise ValueError(f"d_k must be positive, got q of shape {tuple(q.shape)}")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k need the same last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v need the same length S (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    flags(is_causal=is_causal, need_weights=need_weights, enable_gqa=enable_gqa)
    batch = _check_batch(q, k, v, enable_gqa)
    _check_scale(scale)
    dropout(dropout_p)
    if mask is None:
        return q, k, v, None
    keep = as_keep_mask(mask, device=q.device)
    fits(keep, (*batch, q.size(-2), k.size(-2)), "(..., T, S) =")
    return q, k, v, keep


def _check_batch(q, k, v, enable_gqa):
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
    batch = broadcast(*batch_dims)
    if batch is None:
        raise ValueError(
            f"leading dims of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not broadcast"
            + ("" if enable_gqa else " (for fewer K/V heads than query heads pass enable_gqa=True)")
        )
    return (*batch, q.size(-3)) if enable_gqa else tuple(batch)


def _check_scale(s) -> None:
    """Raise unless ``s`` is None or a finite real number (not a bool): the factor on attention's scores."""
    if s is None or isinstance(s, (torch.SymFloat, torch.SymInt)):
        return
    if isinstance(s, bool) or not isinstance(s, numbers.Real):
        raise TypeError(f"scale must be a number (default None: 1 / sqrt(d_k)), got {type(s).__name__} {s!r}")
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite, got {s}: every score would be inf or NaN")


def attend(q, k, v, keep, is_causal=False, scale=None, dropout_p=0.0, need_weights=True, enable_gqa=False):
    """:func:`scaled_dot_product_attention` on inputs that are already checked; ``keep`` is bool or None.

    ``MultiHeadAttention.forward`` calls it after checking its own inputs: its q, k and v come
    from its own projections, so nothing here checks them again.
    """
    T, S = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    # PyTorch's fused kernels have no forward-mode derivative, and no second derivative under torch.func: under
    # forward-mode AD or a torch.func transform the fused path runs the explicit path's code (the same numbers).
    # A graph being compiled or exported skips the two probes, which torch 2.6's dynamo cannot trace.
    fused = not need_weights and (torch.compiler.is_compiling() or forward_ad._current_level < 0
                                  and torch._C._functorch.peek_interpreter_stack() is None)
    if keep is not None:
        # A key no query may look at must not reach the output, not even as 0 * NaN: zero it and its value.
        k, v = _zero_unseen_keys(keep, k, v, enable_gqa)

    # Length logic goes through known_true, so that symbolic lengths (compile, export,
    # tracing) take a shortcut only where it is right for every length.
    # The fused kernel does plain causal self-attention itself, with no mask tensor.
    kernel_causal = fused and is_causal and keep is None and known_true(T == S)
    may_block_a_row = keep is not None  # a mask may leave some query with no key at all
    if is_causal and not kernel_causal and not known_true(T <= 1):  # one query is the last position: it sees all
        causal = _causal_mask(T, S, q.device)  # (T, S)
        keep = causal if keep is None else keep & causal
        may_block_a_row = may_block_a_row or not known_true(T <= S)  # causal alone does when T > S
    has_key = None
    if may_block_a_row:
        # Some query may have no allowed key; its softmax would be over only -inf,
        # giving NaN. Let such rows attend everywhere (finite maths), zero them below.
        # Their output does not depend on their query, so zero that too: NaN there
        # (a padded row) then reaches neither the output nor any gradient.
        has_key = keep.any(dim=-1, keepdim=True)  # (..., T, 1)
        keep = keep | ~has_key
        q = torch.where(has_key, q, 0.0)

    out, weights = ((_fused(q, k, v, keep, kernel_causal, scale, dropout_p, enable_gqa), None) if fused
                    else _explicit(q, k, v, keep, scale, dropout_p, enable_gqa))  # (..., T, d_v), (..., T, S)
    if has_key is not None:  # where, not *: 0 * NaN would be NaN
        out = torch.where(has_key, out, 0.0)
        weights = None if weights is None else torch.where(has_key, weights, 0.0)
    return out, weights if need_weights else None


def _zero_unseen_keys(keep, k, v, enable_gqa):
    seen = (keep.any(dim=-2) if keep.dim() > 1 else keep).unsqueeze(-1)  # (..., S, 1): may any query see key j?
    if enable_gqa and seen.dim() > 2 and seen.size(-3) not in (1, k.size(-3)):  # per query head: a K/V head's
        seen = seen.unflatten(-3, (k.size(-3), -1)).any(dim=-3)  # key is seen if one of its query heads sees it
    return torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)


def _explicit(q, k, v, keep, scale, dropout_p, enable_gqa):
    if enable_gqa:
        return _explicit_grouped(q, k, v, keep, scale, dropout_p)
    # Half precision: 65504 is float16's largest value, so scores and softmax run in
    # float32, with autocast off so that it cannot cast them back down.
    work = torch.float32 if q.dtype in HALF else q.dtype
    with autocast_off(q.device.type):
        scores = (q.to(work) * scale) @ k.to(work).transpose(-2, -1)  # (..., T, S)
        if keep is not None:
            # -inf where blocked (mha.to_additive_mask's conversion). Added in place, not masked_fill:
            # neither the forward nor the backward pass then copies the (..., T, S) table again.
            scores += scores.new_zeros(keep.shape).masked_fill_(~keep, float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(q.dtype)  # (..., T, S), rows sum to 1
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (..., T, d_v), (..., T, S)


def _explicit_grouped(q, k, v, keep, scale, dropout_p):
    # View the h query heads as g groups of r, so each group broadcasts against
    # its one K/V head: no copy of K or V is made.
    h, g = q.size(-3), k.size(-3)
    r = h // g
    q = q.unflatten(-3, (g, r))  # (..., g, r, T, d_k)
    k, v = k.unsqueeze(-3), v.unsqueeze(-3)  # (..., g, 1, S, d)
    if keep is not None and keep.dim() >= 3:
        keep = keep.unflatten(-3, (g, r)) if keep.size(-3) == h else keep.unsqueeze(-3)
    out, weights = _explicit(q, k, v, keep, scale, dropout_p, enable_gqa=False)
    return out.flatten(-4, -3), weights.flatten(-4, -3)  # (..., h, T, d_v), (..., h, T, S)


def _fused(q, k, v, keep, is_causal, scale, dropout_p, enable_gqa):
    keep = keep.expand(q.size(-2), k.size(-2)) if keep is not None and keep.dim() < 2 else keep  # at least (T, S)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=keep, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=True if enable_gqa else False,  # torch 2.6's dynamo may hand a SymBool, which sdpa refuses
    )
    # A fused kernel's backward node (not the math kernel's; none in a compiled graph) gets its second derivative.
    if (node := None if torch.compiler.is_compiling() else out.grad_fn) and node.name().startswith("ScaledDotProduct"):
        node.register_hook(_differentiable_backward)  # below
    return out


# -- second derivatives on the fused path -------------------------------------------------------------------
# PyTorch's fused kernels (flash, memory-efficient, cuDNN) have a backward that cannot itself be differentiated:
# a gradient of a gradient (a gradient penalty, MAML, a Hessian-vector product, create_graph=True) raised
# "derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented" (case C25).
# A first derivative keeps PyTorch's fused backward; in a backward that builds a graph, a hook hands on the
# gradient of PyTorch's math kernel instead, the same formula written in differentiable operations.


def _differentiable_backward(grad_inputs, grad_outputs):
    """Post-hook of a fused kernel's backward node: in a backward that builds a graph (``create_graph=True``),
    replace its gradients of q, k and v by the math kernel's, recomputed from what the node saved."""
    if not torch.is_grad_enabled():  # a first derivative: the fused backward's is right, and fast
        return None
    node = torch._C._current_autograd_node()  # the node this hook is on (a reference kept would be a cycle)
    if node._saved_dropout_p > 0:
        raise RuntimeError(
            "a gradient of a gradient through attention with dropout on the fused path (need_weights=False): "
            "PyTorch's fused kernel has no second derivative, and its dropout mask cannot be drawn again; "
            "use need_weights=True, which supports every kind of differentiation"
        )
    # Aliases, so that q, k and v get their own gradients even when they are one tensor (self-attention on x).
    try:
        q, k, v = (t.view_as(t) for t in (node._saved_query, node._saved_key, node._saved_value))
    except CheckpointError:  # the fused backward has unpacked them, and a checkpoint lets that happen only once
        raise RuntimeError(
            "a gradient of a gradient through attention on the fused path (need_weights=False) inside "
            "torch.utils.checkpoint: PyTorch's fused kernel has no second derivative, and under a checkpoint q, k "
            "and v cannot be read a second time to compute it with the math kernel; use need_weights=True, which "
            "supports every kind of differentiation"
        ) from None
    mask = getattr(node, "_saved_attn_mask", getattr(node, "_saved_attn_bias", None))
    with torch.enable_grad():
        out, _ = torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, mask, 0.0, node._saved_is_causal, scale=node._saved_scale, enable_gqa=k.size(-3) != q.size(-3)
        )
    wanted = [g is not None for g in grad_inputs[:3]]  # the engine asks only for the gradients it needs
    grads = iter(torch.autograd.grad(out, [t for t, w in zip((q, k, v), wanted) if w], grad_outputs[0],
                                     create_graph=True))
    return (*(next(grads) if w else None for w in wanted), *grad_inputs[3:])


# -- two guards the maths needs: symbolic lengths and autocast ---------------------------------------------


def known_true(cond) -> bool:
    """True when a condition on lengths is known to hold, without tying a recorded graph to one length.

    In eager PyTorch lengths are ints and ``cond`` a bool. ``torch.compile(dynamic=True)`` and
    ``torch.export`` record one graph for every length, handing the code symbolic lengths, and
    ``torch.jit.trace`` 0-dim tensors, on which ``if T > 1`` either fails or bakes one length in.
    So the maths takes a *shortcut* (PyTorch's own causal kernel, no causal mask for one query)
    only when this answers True; otherwise the general path runs, which is right for every length.

    * A ``torch.SymBool`` (``torch.export``, non-strict): True only when the symbols' ranges prove
      it, as for ``T == S`` in self-attention, where both are one symbol. No guard is added.
    * Dynamo (``torch.compile``, strict export), where a symbolic condition poses as a bool: decided
      as dynamo decides any ``if`` on lengths. For self-attention and cached decoding the
      conditions asked here are settled by the symbols' ranges, so one graph serves every length.
    * ``torch.jit.trace`` (a 0-dim tensor): never known, so the trace records the general path.
    """
    if isinstance(cond, torch.Tensor):  # traced
        return False
    if isinstance(cond, torch.SymBool):
        return statically_known_true(cond)
    return True if cond else False  # a bool, or dynamo's symbolic condition (an `if` it can guard)


def autocast_off(device_type: str):
    """A context in which ``torch.autocast`` does not act, so float32 scores stay float32 (see mha.precision)."""
    try:
        return torch.autocast(device_type, enabled=False)
    except RuntimeError:  # a device type autocast does not know (meta, say)
        return contextlib.nullcontext()
