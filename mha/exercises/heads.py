"""Checkers for split_heads and merge_heads, the two reshapes that make attention multi-head."""

from __future__ import annotations

import torch

from ._core import Mistake, call, checker, difference, expect_tensor, matches, shape
from .mistakes import say

# (B, T, h, d_k, dtype): the first probe has every size different, so a reshape that confuses
# two of them shows; the second catches an h or a width written into the code, the third
# B = h = 1 (a .squeeze() that drops them), the fourth code that casts to float32.
_PROBES = [
    (2, 5, 3, 4, torch.float32),
    (3, 2, 4, 5, torch.float32),
    (1, 3, 1, 6, torch.float32),
    (2, 4, 2, 3, torch.float64),
]

_VIEW_HINT = "x is not always contiguous (the article splits qkv(x), whose q is a slice): use reshape, or .contiguous()"


def _data(*dims: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*dims, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _view_hint(error: str) -> str:
    return _VIEW_HINT if "view" in error else say("later probe")


def _split_reference(x: torch.Tensor, h: int) -> torch.Tensor:
    # Head i is columns i*d_k .. (i+1)*d_k - 1 of every token, stacked on a new dim 1.
    d_k = x.size(-1) // h
    return torch.stack([x[..., i * d_k : (i + 1) * d_k] for i in range(h)], dim=1)


def _merge_reference(x: torch.Tensor) -> torch.Tensor:
    # Each token's h head outputs laid side by side: head 0's d_k values first.
    return torch.cat([x[:, i] for i in range(x.size(1))], dim=-1)


def _squeezed(y: torch.Tensor, right: torch.Tensor, what: str, names: str) -> None:
    """A Mistake when y is the right answer with its size-1 dims squeezed away."""
    if right.dim() > y.dim() and matches(y, right.squeeze()):
        ones = [n for n, size in zip(names.split(), right.shape) if size == 1]
        dims = " and ".join(ones) + (" are" if len(ones) > 1 else " is")
        raise Mistake(say("squeeze", what=what, got=shape(*y.shape), dims=dims, want=names.replace(" ", ", ")))


@checker("split_heads", "fn(x, h)")
def check_split_heads(fn) -> str:
    """Check ``fn(x, h)``: x (B, T, D) -> (B, h, T, D // h), head i = columns i·d_k to (i+1)·d_k.

    Probes CPU tensors with (B, T, h, d_k) = (2, 5, 3, 4), (3, 2, 4, 5),
    (1, 3, 1, 6) in float32 and (2, 4, 2, 3) in float64; the second x is the
    first third of a wider tensor, as q is of ``qkv(x)``, so it is not
    contiguous. The result must keep x's dtype. Names the mistake "transpose"
    when x is reshaped into (B, h, T, d_k) without the transpose, or the
    transpose is left out; also explains an h written into the code, head
    columns taken every h-th, and a ``.squeeze()`` that drops B or h = 1.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not done yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for seed, (B, T, h, d_k, dtype) in enumerate(_PROBES):
        wide = _data(B, T, 3 * h * d_k, seed=seed, dtype=dtype)  # the second x is its first third, as q of qkv(x)
        x = wide[..., : h * d_k] if seed == 1 else wide[..., : h * d_k].contiguous()
        probe = f"for x of shape {shape(B, T, h * d_k)}" + (f" in {dtype}" if dtype != torch.float32 else "")
        probe += f"{' (not contiguous)' if seed == 1 else ''} and h={h}"
        given = wide.clone()[..., : h * d_k] if seed == 1 else x.clone()
        got = call(fn, given, h, what="your split_heads", probe=probe, hint=_view_hint)
        y = expect_tensor(got, "split_heads(x, h)", probe, dtype)
        right = _split_reference(x, h)
        if matches(y, right):
            continue
        _diagnose_split(fn, y, x, right, B, T, h, d_k, probe)
    return "(B, T, h·d_k) -> (B, h, T, d_k) on 4 probes, e.g. (2, 5, 12) with h=3 -> (2, 3, 5, 4)."


def _diagnose_split(fn, y, x, right, B, T, h, d_k, probe):
    sizes = f" = {shape(B, h, T, d_k)}"
    if matches(y, x.reshape(B, h, T, d_k)):
        raise Mistake(say("split without transpose", sizes=sizes), "transpose", probe=probe)
    if matches(y, x.reshape(B, T, h, d_k)):
        raise Mistake(say("split transpose forgotten", sizes=f" = {shape(B, T, h, d_k)}"), "transpose", probe=probe)
    if matches(y, x.reshape(B, T, d_k, h).permute(0, 3, 1, 2)):
        raise Mistake(say("split interleaved"), probe=probe)
    for other in range(1, h * d_k + 1):
        if other != h and (h * d_k) % other == 0 and matches(y, _split_reference(x, other)):
            if other == d_k and _width_is_h(fn):  # (B, T, d_k, h): not a number written into the code
                raise Mistake(say("split sizes swapped", d_k=d_k, h=h), probe=probe)
            raise Mistake(say("fixed heads", got=f"{other} head{'s' if other > 1 else ''}", h=other), probe=probe)
    try:
        _squeezed(y, right, "split_heads(x, h)", "B h T d_k")
    except Mistake as m:
        raise Mistake(m.message, probe=probe) from None
    raise Mistake(difference(y, right, "split_heads(x, h)"), probe=probe)


def _width_is_h(fn) -> bool:
    """Whether fn splits a (1, 2, 6) x with h=2 into 3 heads of width 2, as a view (B, T, d_k, h) does: a fixed
    number of heads or a fixed width (both 4, say) would not."""
    x = _data(1, 2, 6, seed=9)
    try:
        y = fn(x.clone(), 2)
    except Exception:  # the learner's code: any error means it is not the swap
        return False
    return isinstance(y, torch.Tensor) and tuple(y.shape) == (1, 3, 2, 2) and matches(y, _split_reference(x, 3))


@checker("merge_heads", "fn(x)")
def check_merge_heads(fn) -> str:
    """Check ``fn(x)``: x (B, h, T, d_k) -> (B, T, h·d_k), each token's heads side by side.

    Probes CPU tensors with (B, h, T, d_k) = (2, 3, 5, 4), (3, 4, 2, 5),
    (1, 1, 3, 6) in float32 and (2, 2, 4, 3) in float64; the second x is laid
    out in memory as (B, T, h, d_k), as PyTorch's fused attention returns it,
    so it is not contiguous. The result must keep x's dtype. Names the mistake
    "transpose" when the heads are reshaped into (B, T, h·d_k) without moving h
    next to d_k first (case C6), and "concat" when the heads are summed or
    averaged instead of concatenated; also explains interleaved heads, a
    missing flatten, ``view`` on a non-contiguous tensor and ``.squeeze()``.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not done yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for seed, (B, T, h, d_k, dtype) in enumerate(_PROBES):
        if seed == 1:  # as F.scaled_dot_product_attention returns it: (B, T, h, d_k) in memory
            x = _data(B, T, h, d_k, seed=seed, dtype=dtype).transpose(1, 2)
        else:
            x = _data(B, h, T, d_k, seed=seed, dtype=dtype)
        probe = f"for x of shape (B, h, T, d_k) = {shape(B, h, T, d_k)}"
        probe += f" in {dtype}" if dtype != torch.float32 else (" (not contiguous)" if seed == 1 else "")
        given = x.clone() if x.is_contiguous() else x.transpose(1, 2).clone().transpose(1, 2)
        got = call(fn, given, what="your merge_heads", probe=probe, hint=_merge_view_hint)
        y = expect_tensor(got, "merge_heads(x)", probe, dtype)
        right = _merge_reference(x)
        if matches(y, right):
            continue
        _diagnose_merge(y, x, right, B, T, h, d_k, probe)
    return "(B, h, T, d_k) -> (B, T, h·d_k) on 4 probes, e.g. (2, 3, 5, 4) -> (2, 5, 12)."


def _merge_view_hint(error: str) -> str:
    if "view" not in error:
        return say("later probe")
    return ("After transpose(1, 2) the tensor is not contiguous, so view cannot flatten it: use reshape (or "
            ".contiguous().view), which works whatever the memory layout")


def _diagnose_merge(y, x, right, B, T, h, d_k, probe):
    if matches(y, x.reshape(B, T, h * d_k)):
        raise Mistake(say("merge without transpose"), "transpose", probe=probe)
    for how in ("sum", "mean"):
        if matches(y, getattr(x, how)(dim=1)) or matches(y, getattr(x, how)(dim=1).repeat(1, 1, h)):
            sizes = f" = {shape(B, T, h * d_k)}"
            raise Mistake(say("heads summed", how="sum" if how == "sum" else "average", sizes=sizes), "concat",
                          probe=probe)
    if matches(y, x.transpose(1, 2)):
        raise Mistake(say("merge not flattened", sizes=f" = {shape(B, T, h, d_k)}"), probe=probe)
    if matches(y, x.permute(0, 2, 3, 1).reshape(B, T, h * d_k)):
        raise Mistake(say("merge interleaved"), probe=probe)
    try:
        _squeezed(y, right, "merge_heads(x)", "B T h·d_k")
    except Mistake as m:
        raise Mistake(m.message, probe=probe) from None
    raise Mistake(difference(y, right, "merge_heads(x)"), probe=probe)
