"""Keep-masks: check them, and build the two that attention needs most, causal and padding.

Every mask in this library is a *keep-mask*: True (or 1) means "this query may attend to this key", False (or 0)
means "blocked". PyTorch has two other conventions (the README's "The mask convention"); ``mha.to_torch_attn_mask``
and ``mha.to_additive_mask`` convert to them.
"""

from __future__ import annotations

import numbers

import torch

CONVENTION = "mha masks are keep-masks: True or 1 = this query may attend to this key, False or 0 = blocked"


def as_keep_mask(mask: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Check a keep-mask and return it as a bool tensor (True = may attend) of the same shape, on ``device``.

    Args:
        mask: a bool tensor, or an integer or float tensor holding only 0 and 1.
        device: where the mask is used (q's device); None keeps it where it is.

    Raises:
        TypeError: ``mask`` is not a dense real tensor (a sparse mask: pass ``mask.to_dense()``).
        ValueError: an integer or float mask holds values other than 0 and 1. An additive float mask (0 = attend,
            -inf = blocked, as ``F.scaled_dot_product_attention`` reads float masks) lands here and is never
            reinterpreted silently: convert it with ``additive == 0``. So does a float mask of all zeros, which as a
            keep-mask would block everything and is most likely an additive mask that blocks nothing.

    Under ``torch.compile(fullgraph=True)`` pass a bool mask: an integer or float one is checked by reading it.
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype.is_complex or mask.layout != torch.strided:
        raise TypeError(_not_a_mask(mask))
    mask = mask.detach().to(device)
    if mask.dtype != torch.bool:
        binary = (mask == 0) | (mask == 1)
        if not binary.all() or mask.is_floating_point() and mask.numel() and not mask.any():
            raise ValueError(_not_01(mask, binary))
        mask = mask.bool()
    return mask


def causal_mask(T: int, S: int | None = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The causal keep-mask (T, S), aligned bottom-right: query i may attend to key j when ``j <= i + (S - T)``.

    The T queries are the *last* T of the S positions. With T == S this is ``tril(ones(T, T))``; with T < S (new
    tokens against cached keys) each query also sees every earlier key. ``F.scaled_dot_product_attention(
    is_causal=True)`` aligns top-left instead (case C5).

    Returns:
        A bool tensor (T, S) on ``device``, True = may attend.

    Raises:
        TypeError: T or S is not an int. ValueError: T or S is negative.
    """
    S = T if S is None else S
    for name, n in (("T", T), ("S", S)):
        if isinstance(n, bool) or not isinstance(n, (numbers.Integral, torch.SymInt, torch.Tensor)) or isinstance(
                n, torch.Tensor) and (n.dim() or n.is_floating_point()):  # (a traced size is a 0-dim tensor)
            raise TypeError(f"{name} must be an int, got {n!r}")
        if n < 0:
            raise ValueError(f"causal_mask needs T >= 0 and S >= 0, got T={T}, S={S}")
    # From T and S as tensor ops (not tril's int diagonal), so that a compiled graph follows the lengths it runs with.
    return torch.arange(S, device=device) <= torch.arange(T, device=device)[:, None] + (S - T)


def padding_mask(
    lengths: torch.Tensor | list[int], S: int | None = None, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The keep-mask (B, S) that is True on each sequence's real tokens: sequence b has ``lengths[b]`` of them
    at the start, then padding.

    For ``MultiHeadAttention`` pass it as ``mask[:, None, None, :]`` (B, 1, 1, S): every query, in every head,
    ignores the padding keys. The padded queries still get outputs (attending to the real keys), which a model
    ignores; when the padded rows of x may hold NaN, mask them too, ``pad[:, None, :, None] & pad[:, None, None, :]``,
    or replace them, ``x.masked_fill(~pad[..., None], 0.0)`` (the mask convention page).

    Args:
        lengths: (B,) a list of ints or a 1-D integer tensor, each in [0, S].
        S: the padded length; defaults to ``max(lengths)``.
        device: where to build the mask (defaults to the device of ``lengths``).

    Raises:
        TypeError: lengths is not a list or 1-D tensor of integers (a single int, say), or S is not an int.
        ValueError: lengths are not 1-D, or a length is negative or above S.
    """
    if isinstance(lengths, torch.Tensor):
        device = lengths.device if device is None else device
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise TypeError(f"lengths must be integers, got {lengths.dtype}")
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
        lengths = lengths.tolist()
    elif not isinstance(lengths, (list, tuple, range)) and not hasattr(lengths, "__array__"):
        raise TypeError(f"lengths must be a list of ints or a 1-D integer tensor, one length per sequence, "
                        f"got {type(lengths).__name__} {lengths!r}")
    if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in lengths):
        raise TypeError(f"lengths must be integers, got {list(lengths)}")
    lengths = [int(n) for n in lengths]
    S = max(lengths, default=0) if S is None else S
    if isinstance(S, bool) or not isinstance(S, numbers.Integral):
        raise TypeError(f"S must be an int, got {S!r}")
    if lengths and (min(lengths) < 0 or max(lengths) > S):
        raise ValueError(f"every length must be in [0, S={S}], got {list(lengths)}")
    return torch.arange(S, device=device) < torch.tensor(lengths, dtype=torch.long, device=device)[:, None]


# -- the errors' messages --------------------------------------------------------------------------------------


def _not_a_mask(mask) -> str:
    if not isinstance(mask, torch.Tensor):
        return f"mask must be a torch.Tensor, got {type(mask).__name__}"
    if mask.dtype.is_complex:
        return f"mask must be bool, integer or float, got {mask.dtype}"
    return f"mask must be a dense tensor, got layout {mask.layout}: pass mask.to_dense()"


def _not_01(mask, binary) -> str:
    if binary.all():  # a float mask of zeros only: as a keep-mask it blocks every key, which nobody means
        return (f"float mask of shape {tuple(mask.shape)} is all zeros, which as a keep-mask blocks every key. "
                f"{CONVENTION}. If it is an additive mask with nothing blocked, pass mask=None (or a bool mask: "
                "`keep = (additive_mask == 0)`).")
    bad = sorted({str(v) for v in mask[~binary].tolist()})[:4]
    hint = ""
    if mask.is_floating_point() and (mask < 0).any():
        hint = (" It looks like an additive mask (0 = attend, -inf = blocked); convert it with "
                "`keep = (additive_mask == 0)`.")
    return f"{mask.dtype} mask holds values other than 0 and 1 (e.g. {', '.join(bad)}). {CONVENTION}.{hint}"
