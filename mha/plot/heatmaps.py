"""Heatmaps of attention: one per head (:func:`plot_heads`), and keep-masks (:func:`plot_mask`).

Needs matplotlib (``pip install "mha[notebooks]"``), imported when a figure is drawn: without it, importing
this module works and drawing raises ModuleNotFoundError naming the extra to install.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ._optional import pyplot
from .labels import AS_WRITTEN, label, not_one_string

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_heads(
    weights: torch.Tensor,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
    ncols: int | None = None,
    title: str | None = None,
    head_names: Sequence[str] | None = None,
    cmap: str = "viridis",
    size: float | None = None,
    vmax: float | None = None,
) -> Figure:
    """Draw one heatmap per head, on one shared colour scale with one colorbar.

    Rows are queries (y axis, labelled "query"), columns are keys (x axis,
    labelled "key"); bright = much weight.

    The colour scale runs from 0 to ``vmax``. By default ``vmax`` is the
    largest weight in the rows that *have a choice*, i.e. that spread their
    weight over two keys or more. A row whose whole weight sits on one key is
    left out of that maximum: under a causal mask row 0 can see only key 0 and
    always gives it 1.0, and that forced 1.0 says nothing about the head, yet
    as the top of the scale it would wash every other row out to dark colours
    (an untrained head's later rows hold weights of about 1/T). Such a weight
    is still drawn, in the top colour, and the colorbar then ends in an arrow
    ("extend='max'") to show that some values lie above the scale. When no
    row has a choice, the scale runs to the largest weight.

    Args:
        weights: (h, T, S), or (B, h, T, S) with ``batch_index`` choosing the
            sample. Any device; tensors that require grad are fine.
        tokens: T labels for the query rows (and the key columns too when
            ``key_tokens`` is None and T == S).
        key_tokens: S labels for the key columns.
        batch_index: which sample of a 4-D ``weights`` to draw.
        ncols: heads per row of the grid; default min(h, 4).
        title: figure title.
        head_names: one subplot title per head; default "head 0", "head 1", ...
        cmap: matplotlib colormap; the default, viridis, reads the same
            for colour-blind viewers and in greyscale.
        size: inches per subplot; default 2.6, less when that would make the
            figure wider than 8.8 in (4 heads a row: 2 in), so that it is not
            shrunk much on a page or the website.
        vmax: top of the colour scale; a positive number, or None for the
            default described above. Pass 1.0 to compare figures on one
            absolute scale.

    Returns:
        The matplotlib Figure (h heatmap axes plus one colorbar axis), all
        heatmaps on the colour scale 0 to vmax.

    Raises:
        TypeError: tokens, key_tokens or head_names is a single string, or
            batch_index is not an int.
        ValueError: weights is not 3-D or 4-D or holds NaN (names where),
            batch_index is out of range, ncols is not positive, vmax is not
            a positive finite number, or the labels don't match h, T or S.
        ModuleNotFoundError: matplotlib is not installed (names the extra).
    """
    w = _as_numpy(weights)
    index = _index(batch_index)
    if index is None:
        raise TypeError(f"batch_index must be an int, got {type(batch_index).__name__} {batch_index!r}")
    batch_index = index
    if w.ndim == 4:
        if not -w.shape[0] <= batch_index < w.shape[0]:
            raise ValueError(f"batch_index={batch_index} is out of range for batch size {w.shape[0]}")
        w = w[batch_index]
    if w.ndim != 3 or w.shape[0] == 0:
        raise ValueError(f"weights must be (h, T, S) or (B, h, T, S) with h >= 1, got shape {tuple(weights.shape)}")
    h, T, S = w.shape
    nan = torch.from_numpy(w).isnan().nonzero()  # (n, 3): head, query, key of each NaN
    if len(nan):
        head, query, key = nan[0].tolist()
        raise ValueError(f"weights contain NaN ({len(nan)} of {w.size}), the first at head {head}, query {query}, "
                         f"key {key}: a NaN weight would be drawn as an empty cell")
    if key_tokens is None and tokens is not None and T == S:
        key_tokens = tokens
    _check_labels(tokens, T, "tokens", "T")
    _check_labels(key_tokens, S, "key_tokens", "S")
    head_names = head_names or [f"head {i}" for i in range(h)]
    _check_labels(head_names, h, "head_names", "h")
    columns = min(h, 4) if ncols is None else _index(ncols)
    if columns is None or columns < 1:
        raise ValueError(f"ncols must be a positive int, got {ncols!r}")
    ncols = columns
    nrows = math.ceil(h / ncols)
    if size is None:
        size = min(2.6, 8.0 / ncols)
    if vmax is None:
        has_choice = (w > 0).sum(-1) >= 2  # (h, T): rows with weight on two keys or more
        shown = w[has_choice] if has_choice.any() else w
        vmax = float(shown.max()) if shown.size else 1.0
        vmax = vmax if vmax > 0 else 1.0  # all-zero weights (every key blocked): any scale will do
    else:
        top = _real(vmax)
        if top is None or not 0 < top < math.inf:
            raise ValueError(f"vmax must be a positive finite number or None, got {vmax!r}")
        vmax = top
    plt = pyplot("plot_heads")
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size * ncols + 0.8, size * nrows + 0.4), squeeze=False,
        constrained_layout=True,
    )
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.remove()  # an empty slot at the end of the grid
            continue
        image = ax.imshow(w[i], vmin=0.0, vmax=vmax, cmap=cmap)
        ax.set_title(label(head_names[i]), fontsize="medium", **AS_WRITTEN)
        _label_axes(ax, tokens, key_tokens)
        if i % ncols == 0:  # first column
            ax.set_ylabel("query")
        if i + ncols >= h:  # no heatmap below this one
            ax.set_xlabel("key")
    extend = "max" if (w > vmax).any() else "neither"
    fig.colorbar(image, ax=axes.ravel().tolist()[:h], shrink=0.8, label="attention weight", extend=extend)
    if title:
        fig.suptitle(label(title), **AS_WRITTEN)
    return fig


def plot_mask(
    mask: torch.Tensor,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    size: float = 3.0,
) -> Figure:
    """Draw a 2-D keep-mask: bright = may attend (True/1), dark = blocked.

    The colours match :func:`plot_heads`, where a blocked key gets weight 0
    and is drawn dark.

    Args:
        mask: (T, S) keep-mask, bool, integer or float 0/1, any device.
        tokens, key_tokens: row and column labels, as in :func:`plot_heads`.
        title: axes title.
        size: figure height in inches.

    Returns:
        The matplotlib Figure (one axes, colour limits 0 and 1).

    Raises:
        ValueError: the mask is not 2-D or not 0/1, or labels don't match.
        ModuleNotFoundError: matplotlib is not installed (names the extra).
    """
    from ..masks import as_keep_mask

    keep = as_keep_mask(mask)
    if keep.dim() != 2:
        raise ValueError(f"plot_mask draws a (T, S) mask, got shape {tuple(keep.shape)}")
    T, S = keep.shape
    if key_tokens is None and tokens is not None and T == S:
        key_tokens = tokens
    _check_labels(tokens, T, "tokens", "T")
    _check_labels(key_tokens, S, "key_tokens", "S")
    plt = pyplot("plot_mask")
    fig, ax = plt.subplots(figsize=(size * S / max(T, 1) + 0.6, size), constrained_layout=True)
    ax.imshow(_as_numpy(keep.float()), vmin=0.0, vmax=1.0, cmap="viridis")
    _label_axes(ax, tokens, key_tokens)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(label(title), **AS_WRITTEN)
    return fig


def _index(value) -> int | None:
    """value as an int (a NumPy int or a 0-dim integer tensor too), or None; a bool is not an index here."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor) and value.dtype == torch.bool:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _real(value) -> float | None:
    """value as a float when it is one real number (a NumPy scalar or a one-element tensor too), or None."""
    if isinstance(value, torch.Tensor):
        ok = value.numel() == 1 and not (value.dtype == torch.bool or value.is_complex())
        return float(value) if ok else None
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


def _as_numpy(t: torch.Tensor):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    return t.detach().float().cpu().numpy()


def _check_labels(labels, n, name, dim):
    not_one_string(labels, name)
    if labels is not None and len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels but {dim} = {n}")


def _label_axes(ax, tokens, key_tokens):
    """Tick labels that show each token as written (case C31: "$x$" was drawn as math, "$_$" crashed the draw)."""
    if tokens is not None:
        ax.set_yticks(range(len(tokens)), labels=[label(t) for t in tokens], fontsize="small", **AS_WRITTEN)
    if key_tokens is not None:
        ax.set_xticks(range(len(key_tokens)), labels=[label(t) for t in key_tokens], fontsize="small", rotation=90,
                      **AS_WRITTEN)
