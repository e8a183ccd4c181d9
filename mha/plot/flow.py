"""The layer's data flow as a picture: :func:`plot_data_flow`, drawn tall and narrow so that it reads on a phone.

Needs matplotlib (``pip install "mha[notebooks]"``), imported when the picture is drawn.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

from ._optional import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Okabe & Ito's colour-blind-safe palette, one colour per head (each head is also named: h0, h1, ...).
HEAD_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")
WIDTH, FONT = 4.0, 10.5  # inches and points: 10.5 pt on a 4-inch figure is about 13 px on a 390 px phone


def plot_data_flow(d_model: int = 32, h: int = 4, B: int = 2, T: int = 6) -> Figure:
    """Draw multi-head self-attention from x to y, top to bottom, with the shape of every step.

    x (B, T, d_model) -> one Linear -> Q, K, V -> viewed as h heads (B, h, T, d_k) -> h attentions ->
    concatenated -> W_O -> y (B, T, d_model), with d_k = d_model / h. The defaults are the article's
    example. The figure is 4 inches wide, its text 10.5 pt; each head has its colour and its name.

    Args:
        d_model, h, B, T: the model width, the number of heads (1 to 8), the batch size, the length.

    Returns:
        The matplotlib Figure (one axes, no ticks).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is not positive, h > 8, or h does not divide d_model.
        ModuleNotFoundError: matplotlib is not installed (names the extra).
    """
    for name, value in (("d_model", d_model), ("h", h), ("B", B), ("T", T)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if h > len(HEAD_COLOURS):
        raise ValueError(f"plot_data_flow draws at most {len(HEAD_COLOURS)} heads side by side, got h={h}")
    if d_model % h:
        raise ValueError(f"d_model={d_model} is not divisible by h={h}: each head needs d_k = d_model / h")
    d_k = d_model // h
    plt = pyplot("plot_data_flow")
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig, ax = plt.subplots(figsize=(WIDTH, 8.6))
    fig.subplots_adjust(0, 0, 1, 1)
    ax.set(xlim=(0, 10), ylim=(0, 21.5))
    ax.axis("off")

    def box(x0, y0, w, hgt, text, colour="white", edge="black", size=FONT, weight="normal"):
        ax.add_patch(Rectangle((x0, y0), w, hgt, facecolor=colour, edgecolor=edge, lw=1.2))
        ax.text(x0 + w / 2, y0 + hgt / 2, text, ha="center", va="center", fontsize=size, fontweight=weight)

    def arrow(y_from, y_to, label=None, x=5.0):
        ax.add_patch(FancyArrowPatch((x, y_from), (x, y_to), arrowstyle="-|>", mutation_scale=14, lw=1.4,
                                     color="black"))
        if label:
            ax.text(x + 0.25, (y_from + y_to) / 2, label, ha="left", va="center", fontsize=FONT, style="italic")

    heads = range(h)
    slot = 9.2 / h  # the width of one head's column, between x = 0.4 and 9.6
    light = [_lighten(HEAD_COLOURS[i]) for i in heads]

    box(2.0, 19.6, 6.0, 1.4, f"x   (B, T, d_model)\n= ({B}, {T}, {d_model})", weight="bold")
    arrow(19.6, 18.6)
    box(1.0, 17.2, 8.0, 1.4, f"one Linear({d_model}, {3 * d_model}): qkv\nrows [W_Q; W_K; W_V]")
    arrow(17.2, 16.2)
    for j, name in enumerate("QKV"):  # three (B, T, d_model) tensors, each cut into h coloured pieces
        x0 = 0.4 + j * 3.15
        for i in heads:
            ax.add_patch(Rectangle((x0 + i * 2.9 / h, 14.6), 2.9 / h, 1.6, facecolor=light[i], edgecolor="none"))
        box(x0, 14.6, 2.9, 1.6, f"{name}\n({B}, {T}, {d_model})", colour="none")
    arrow(14.6, 13.4, f"view as {h} heads: d_k = {d_model}/{h} = {d_k}")
    for i in heads:
        box(0.4 + i * slot + 0.08, 11.2, slot - 0.16, 2.2, f"h{i}\nq k v", colour=light[i])
    ax.text(5.0, 10.75, f"q, k, v: (B, h, T, d_k) = ({B}, {h}, {T}, {d_k})", ha="center", va="center",
            fontsize=FONT)
    arrow(10.4, 9.4, f"{h} attentions, one per head")
    for i in heads:
        box(0.4 + i * slot + 0.08, 7.4, slot - 0.16, 2.0, f"h{i}\nsoft-\nmax" if slot < 1.8 else f"h{i}\nsoftmax",
            colour=light[i])
    ax.text(5.0, 6.85, f"each: softmax(q kᵀ/√{d_k}) v\nweights ({B}, {h}, {T}, {T}), outputs ({B}, {h}, {T}, {d_k})",
            ha="center", va="center", fontsize=FONT)
    arrow(6.2, 5.6, "concatenate the heads")
    for i in heads:
        ax.add_patch(Rectangle((1.0 + i * 8.0 / h, 4.0), 8.0 / h, 1.6, facecolor=light[i], edgecolor="none"))
    box(1.0, 4.0, 8.0, 1.6, f"(B, T, h·d_k) = ({B}, {T}, {d_model})", colour="none")
    arrow(4.0, 3.0)
    box(1.0, 1.6, 8.0, 1.4, f"W_O: Linear({d_model}, {d_model}), mixes the heads")
    arrow(1.6, 1.05)
    ax.text(5.0, 0.5, f"y   (B, T, d_model) = ({B}, {T}, {d_model})", ha="center", va="center", fontsize=FONT,
            fontweight="bold")
    return fig


def _lighten(colour: str, keep: float = 0.45) -> tuple[float, float, float]:
    """The colour mixed with white (``keep`` of the colour), so that black text on it stays readable."""
    rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(keep * c + (1 - keep) for c in rgb)
