"""Keep-masks: build them, check them, and convert them for PyTorch.

Every mask in this library is a *keep-mask*: True (or 1) means "this query may
attend to this key", False (or 0) means "blocked". The convention, and how it
differs from PyTorch's, is written out in the README ("The mask convention").
"""

from __future__ import annotations

import numbers

import torch

from .values import check_int, fits, sequence, tensor

_CONVENTION = "mha masks are keep-masks: True or 1 = this query may attend to this key, False or 0 = blocked"


def as_keep_mask(mask: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Check a keep-mask and return it as a bool tensor on ``device``.

    Args:
        mask: bool, integer or floating tensor of any shape. Integer and float
            masks may hold only 0 and 1.
        device: where the mask is used (normally q's device); None keeps it
            where it is.

    Returns:
        A bool tensor of the same shape, True = may attend.

    Raises:
        TypeError: ``mask`` is not a tensor, is complex, or is not dense
            (a sparse mask: pass ``mask.to_dense()``).
        ValueError: an integer or float mask holds values other than 0 and 1;
            a mask on the meta device for a ``device`` that is not (a meta
            mask holds no values; for a meta layer it gives the shapes).
            An additive float mask (0 = attend, -inf = blocked, the style of
            ``F.scaled_dot_product_attention``'s float masks) lands here: it is
            never reinterpreted silently. Convert it with ``additive == 0``.
            So does a float mask of all zeros: as a keep-mask it would block
            everything, and it is most likely an additive mask blocking nothing.
    """
    if not isinstance(mask, torch.Tensor):
        tensor("mask", mask)
    if mask.dtype.is_complex or mask.layout != torch.strided or mask.is_meta:
        mask = _unusual(mask, device)  # refused, or a meta mask for a meta layer: its shape only
    mask = mask.detach().to(device) if device is not None else mask.detach()
    if mask.dtype == torch.bool:
        return mask
    return _from_01(mask)


def _from_01(mask):
    """An integer or float keep-mask as bool, once its values are checked to be 0 and 1."""
    try:  # reading values, which torch.func.vmap cannot (data-dependent control flow)
        is_binary = (mask == 0) | (mask == 1)
        ok = bool(is_binary.all()) and not (mask.is_floating_point() and mask.numel() and not bool(mask.any()))
    except RuntimeError as err:
        raise TypeError(f"an integer or float mask's values must be read to check that they are 0 and 1, and "
                        f"here they cannot be ({str(err).split('.')[0][:160]}): pass a bool mask") from None
    if not ok:
        _refuse_values(mask, is_binary)
    return mask.bool()


def _unusual(mask, device):
    if mask.dtype.is_complex:
        raise TypeError(f"mask must be bool, integer or float, got {mask.dtype}")
    if mask.layout != torch.strided:
        raise TypeError(f"mask must be a dense tensor, got layout {mask.layout}: pass mask.to_dense()")
    where = mask.device if device is None else torch.device(device)
    if where.type != "meta":
        raise ValueError(f"mask is on the meta device, which holds no values, and q on {where}: make the mask on "
                         f"{where}")
    return mask.bool()  # a meta layer computes shapes only, so a meta mask's 0/1 values need no check


def _refuse_values(mask, is_binary):
    if bool(is_binary.all()):  # a float mask of zeros only
        # As a keep-mask it blocks every key, which nobody means; as an additive mask it blocks nothing.
        raise ValueError(
            f"float mask of shape {tuple(mask.shape)} is all zeros, which as a keep-mask blocks every key. "
            f"{_CONVENTION}. If it is an additive mask with nothing blocked, pass mask=None "
            "(or a bool mask: `keep = (additive_mask == 0)`)."
        )
    bad = sorted({str(v) for v in mask[~is_binary].tolist()})[:4]
    hint = ""
    if mask.is_floating_point() and bool((mask < 0).any()):
        hint = (" It looks like an additive mask (0 = attend, -inf = blocked); "
                "convert it with `keep = (additive_mask == 0)`.")
    raise ValueError(f"{mask.dtype} mask holds values other than 0 and 1 (e.g. {', '.join(bad)}). {_CONVENTION}.{hint}")


def causal_mask(
    T: int, S: int | None = None, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The causal keep-mask, aligned bottom-right.

    Query i may attend to key j when ``j <= i + (S - T)``: the T queries are
    the *last* T positions of the S keys. With T == S this is ``tril(ones)``;
    with T < S (one new token against cached keys) each query also sees every
    earlier key. This is the alignment decoding needs; note that
    ``F.scaled_dot_product_attention(is_causal=True)`` aligns top-left instead.

    Args:
        T: number of queries.
        S: number of keys; defaults to T.
        device: where to build the mask.

    Returns:
        Bool tensor (T, S) on ``device``, True = may attend.

    Raises:
        TypeError: T or S is not an int (symbolic sizes, as under
            ``torch.compile`` or ``torch.export``, count as ints).
        ValueError: T or S is negative.
    """
    S = T if S is None else S
    check_int(T=T, S=S)
    if T < 0 or S < 0:
        raise ValueError(f"causal_mask needs T >= 0 and S >= 0, got T={T}, S={S}")
    return _causal_mask(T, S, device)


def _causal_mask(T, S, device):
    """:func:`causal_mask` of sizes that are already checked (``mha.attention`` builds its causal mask here)."""
    # Built from T and S as tensor ops (not tril's int diagonal), so that under
    # compile, export or tracing the mask follows the lengths the graph is run with.
    query_position = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1): each query's place among the keys
    return torch.arange(S, device=device) <= query_position  # (T, S)


def padding_mask(
    lengths: torch.Tensor | list[int], S: int | None = None, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Keep-mask (B, S) that is True on each sequence's real tokens.

    Sequence b has ``lengths[b]`` real tokens at the start and padding after.
    For ``MultiHeadAttention`` pass it as ``mask[:, None, None, :]`` so that it
    broadcasts to (B, h, T, S): every query, in every head, ignores the padding
    keys.

    When the padded rows of x may hold NaN or inf (an earlier layer's
    garbage), that keeps the real tokens' outputs exact, but not their
    gradients: the padded queries' NaN weights reach every key's gradient in
    the backward pass. Masking the padded queries too keeps ``x``'s gradient
    finite::

        pad = mha.padding_mask(lengths)                       # (B, S)
        keep = pad[:, None, :, None] & pad[:, None, None, :]  # (B, 1, T, S)

    The layer's weights still see those rows (``qkv`` runs on them, and its
    weight's gradient is ``x.T @ grad``, 0 * NaN there, as in
    ``nn.MultiheadAttention``): when the weights train, replace the rows,
    ``x = x.masked_fill(~pad[..., None], 0.0)``.

    Args:
        lengths: (B,) integer tensor or list of ints, each in [0, S].
        S: padded length; defaults to ``max(lengths)``.
        device: where to build the mask (defaults to ``lengths``' device).

    Returns:
        Bool tensor (B, S).

    Raises:
        TypeError: lengths is not a list or tensor of integers (a single
            int, say), or S is not an integer.
        ValueError: lengths are not 1-D, or a length is negative or above S.
    """
    device = lengths.device if device is None and isinstance(lengths, torch.Tensor) else device
    values, S = _check_lengths(lengths, S)  # checked on the host; the mask is built on `device`
    return torch.arange(S, device=device) < torch.tensor(values, dtype=torch.long, device=device)[:, None]


def _check_lengths(lengths, S) -> tuple[list[int], int]:
    """:func:`padding_mask`'s lengths as a list of ints, checked against S (default: the longest)."""
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


def to_torch_attn_mask(
    mask: torch.Tensor, shape: tuple[int, int, int, int] | None = None
) -> torch.Tensor:
    """Convert a keep-mask into ``nn.MultiheadAttention``'s ``attn_mask``.

    ``nn.MultiheadAttention`` reads a boolean ``attn_mask`` the other way
    round: True = *blocked*. Passing a keep-mask such as ``tril(ones)``
    straight through makes every query attend only to the future (and the
    last row turns NaN). This helper inverts it and gives it the shape that
    module accepts.

    Args:
        mask: keep-mask (see :func:`as_keep_mask`). Without ``shape`` it must
            be 2-D (T, S). With ``shape`` it may be anything that broadcasts
            to ``shape``.
        shape: (B, h, T, S) of the attention it is meant for. Needed for
            per-sample or per-head masks, which PyTorch wants as (B*h, T, S).

    Returns:
        Bool tensor, True = blocked: (T, S) without ``shape``, else (B*h, T, S).

    Raises:
        TypeError: a size in ``shape`` is not an int.
        ValueError: the mask is not 2-D and no ``shape`` was given, ``shape``
            is not four sizes, or the mask does not broadcast to it.
    """
    keep = as_keep_mask(mask)
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
    if shape is None:
        return ~keep
    B, h, T, S = shape
    return ~keep.expand(B, h, T, S).reshape(B * h, T, S)


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Convert a keep-mask into an additive float mask: 0 = attend, -inf = blocked.

    This is the meaning ``F.scaled_dot_product_attention`` and
    ``nn.MultiheadAttention`` give to *float* masks (they are added to the
    scores before the softmax).

    Args:
        mask: keep-mask of any shape.
        dtype: floating dtype of the result.

    Returns:
        Tensor of the same shape and ``dtype``.

    Raises:
        TypeError: ``dtype`` is not a floating ``torch.dtype`` (a string
            such as ``"float32"``, say).
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {type(dtype).__name__} {dtype!r}")
    if not dtype.is_floating_point:
        raise TypeError(f"an additive mask must be floating, got dtype={dtype}")
    keep = as_keep_mask(mask)
    zeros = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return zeros.masked_fill(~keep, float("-inf"))
