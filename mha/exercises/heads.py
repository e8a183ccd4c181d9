"""Checkers for split_heads and merge_heads, the two reshapes that make attention multi-head."""

from __future__ import annotations

import torch

from ._core import Mistake, call, checker, difference, expect_tensor, matches, shape

# (B, T, h, d_k): the first probe has every size different, so a reshape that confuses
# two of them shows; the others catch an h or a width written into the code, and h = 1.
_PROBES = [(2, 5, 3, 4), (3, 2, 4, 5), (1, 3, 1, 6)]


def _data(*dims: int, seed: int) -> torch.Tensor:
    return torch.randn(*dims, generator=torch.Generator().manual_seed(seed))


def _split_reference(x: torch.Tensor, h: int) -> torch.Tensor:
    # Head i is columns i*d_k .. (i+1)*d_k - 1 of every token, stacked on a new dim 1.
    d_k = x.size(-1) // h
    return torch.stack([x[..., i * d_k : (i + 1) * d_k] for i in range(h)], dim=1)


def _merge_reference(x: torch.Tensor) -> torch.Tensor:
    # Each token's h head outputs laid side by side: head 0's d_k values first.
    return torch.cat([x[:, i] for i in range(x.size(1))], dim=-1)


@checker("split_heads", "fn(x, h)")
def check_split_heads(fn) -> str:
    """Check ``fn(x, h)``: x (B, T, D) -> (B, h, T, D // h), head i = columns i·d_k to (i+1)·d_k.

    Probes float32 CPU tensors with (B, T, h, d_k) = (2, 5, 3, 4), (3, 2, 4, 5)
    and (1, 3, 1, 6). Names the mistake "transpose" when x is reshaped into
    (B, h, T, d_k) without the transpose, or the transpose is left out.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not implemented yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for seed, (B, T, h, d_k) in enumerate(_PROBES):
        x = _data(B, T, h * d_k, seed=seed)
        probe = f"for x of shape {shape(B, T, h * d_k)} and h={h}"
        y = expect_tensor(call(fn, x.clone(), h, what="your split_heads", probe=probe), "split_heads(x, h)", probe)
        right = _split_reference(x, h)
        if matches(y, right):
            continue
        if matches(y, x.view(B, h, T, d_k)):
            raise Mistake(
                f"you reshape (B, T, h·d_k) straight into (B, h, T, d_k) = {shape(B, h, T, d_k)}. "
                "That cuts the sequence into h pieces instead of cutting each token's vector into h heads: "
                "view it as (B, T, h, d_k) first, then transpose(1, 2).",
                "transpose", probe=probe,
            )
        if matches(y, x.view(B, T, h, d_k)):
            raise Mistake(
                f"you return (B, T, h, d_k) = {shape(B, T, h, d_k)}. The heads dim must come before "
                "the time dim, (B, h, T, d_k): add .transpose(1, 2).",
                "transpose", probe=probe,
            )
        if matches(y, x.view(B, T, d_k, h).permute(0, 3, 1, 2)):
            raise Mistake(
                "head i gets every h-th column of the vector. It must get the contiguous block of "
                "columns i·d_k to (i+1)·d_k - 1 (the layout nn.MultiheadAttention's weights assume): "
                "view as (B, T, h, d_k), not (B, T, d_k, h).", probe=probe
            )
        raise Mistake(difference(y, right, "split_heads(x, h)"), probe=probe)
    return "(B, T, h·d_k) -> (B, h, T, d_k) on 3 probes, e.g. (2, 5, 12) with h=3 -> (2, 3, 5, 4)."


@checker("merge_heads", "fn(x)")
def check_merge_heads(fn) -> str:
    """Check ``fn(x)``: x (B, h, T, d_k) -> (B, T, h·d_k), each token's heads side by side.

    Probes float32 CPU tensors with (B, h, T, d_k) = (2, 3, 5, 4), (3, 4, 2, 5)
    and (1, 1, 3, 6). Names the mistake "transpose" when the heads are reshaped
    into (B, T, h·d_k) without moving h next to d_k first (case C6), and
    "concat" when the heads are summed or averaged instead of concatenated.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not implemented yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for seed, (B, T, h, d_k) in enumerate(_PROBES):
        x = _data(B, h, T, d_k, seed=seed)
        probe = f"for x of shape (B, h, T, d_k) = {shape(B, h, T, d_k)}"
        y = expect_tensor(call(fn, x.clone(), what="your merge_heads", probe=probe), "merge_heads(x)", probe)
        right = _merge_reference(x)
        if matches(y, right):
            continue
        if matches(y, x.reshape(B, T, h * d_k)):
            raise Mistake(
                "you reshape (B, h, T, d_k) straight into (B, T, h·d_k), so the heads get mixed up "
                "with the time steps. Move h next to d_k first: x.transpose(1, 2) gives (B, T, h, d_k), "
                "then reshape(B, T, h·d_k).",
                "transpose", probe=probe,
            )
        for how in ("sum", "mean"):
            if matches(y, getattr(x, how)(dim=1)):
                raise Mistake(
                    f"you {'sum' if how == 'sum' else 'average'} the heads, which leaves "
                    f"(B, T, d_k) = {shape(B, T, d_k)} and throws away what each head found. The heads must be "
                    f"concatenated (concat): each token's h outputs side by side, {shape(B, T, h * d_k)}.",
                    "concat", probe=probe,
                )
        if matches(y, x.transpose(1, 2)):
            raise Mistake(
                f"you return (B, T, h, d_k) = {shape(B, T, h, d_k)}: the transpose is right, now "
                f"flatten the last two dims with reshape(B, T, h·d_k) to get {shape(B, T, h * d_k)}.", probe=probe
            )
        if matches(y, x.permute(0, 2, 3, 1).reshape(B, T, h * d_k)):
            raise Mistake(
                "you interleave the heads (value j of every head, then value j+1, ...). "
                "Concatenate head by head: the first d_k values of each token are head 0's, the next d_k "
                "head 1's. Transpose to (B, T, h, d_k), not (B, T, d_k, h).", probe=probe
            )
        raise Mistake(difference(y, right, "merge_heads(x)"), probe=probe)
    return "(B, h, T, d_k) -> (B, T, h·d_k) on 3 probes, e.g. (2, 3, 5, 4) -> (2, 5, 12)."
