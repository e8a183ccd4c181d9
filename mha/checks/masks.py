"""Checks on keep-masks (``mha.masks``): type, 0/1 values, shapes."""

from __future__ import annotations

import numbers

import torch

from .values import broadcast, check_int, sequence, tensor

_CONVENTION = "mha masks are keep-masks: True or 1 = this query may attend to this key, False or 0 = blocked"


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
    shape = broadcast(mask.shape, target)  # None if they do not broadcast (no try: it runs under compile too)
    if shape is None or tuple(shape) != tuple(target):
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
        lengths = sequence("lengths", lengths, "a list of ints or a 1-D integer tensor, one length per sequence")
        if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in lengths):
            raise TypeError(f"lengths must be integers, got {lengths}")
        lengths = torch.tensor(lengths, dtype=torch.long)
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
        if isinstance(shape, torch.Tensor) or len(sequence("shape", shape, "(B, h, T, S)")) != 4:
            raise ValueError(f"shape must be (B, h, T, S), four sizes, got {shape!r}")
        check_int(**{f"shape's {name}": n for name, n in zip(("B", "h", "T", "S"), shape)})
        fits(keep, tuple(shape))
    return keep


def additive_mask(mask, dtype) -> torch.Tensor:
    """``mha.to_additive_mask``'s mask as a bool keep-mask; ``dtype`` must be floating."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {type(dtype).__name__} {dtype!r}")
    if not dtype.is_floating_point:
        raise TypeError(f"an additive mask must be floating, got dtype={dtype}")
    return keep_mask(mask)
