"""The head view's static picture: one heatmap per layer and head, on one colour scale, as SVG and PNG.

GitHub's notebook viewer strips JavaScript, so this picture (an SVG inside the view's HTML) is all a reader
there sees. It is drawn to be read at its own size: cells at least 12 px, so that the 11 px token labels
beside them do not overlap, at most about 960 px wide (a notebook's output column), and one colour scale
from weight 0 (white) to 1 (dark blue) with its colorbar. A view too big for that is trimmed, and the
picture says what it leaves out: at most 32 queries and keys, and as many heatmaps as fit in 2,800 px of
height (whole layers, the first ones, or the first heads of the first layer). The interactive view always
shows everything.

Deterministic by construction: plain string formatting of integers, so the SVG can sit inside a notebook's
HTML output without breaking strict nbval on another machine. :func:`static_png` draws the same picture with
matplotlib.
"""

from __future__ import annotations

import html
import io
import math
import warnings
from dataclasses import dataclass

from .labels import AS_WRITTEN, display_label, label

MAX_TOKENS = 32  # queries and keys drawn
MAX_HEIGHT = 2800  # px: heatmaps are drawn while they fit in this height (at least one; 12 heads at 32 tokens fit)
WIDTH = 960  # px: the widest the picture gets, about a notebook's output column
MAX_LABEL = 16  # characters of a token label; longer ones end in "…"
FONT = 11  # px
CHAR = 6.6  # px per character at 11 px, a generous average for a sans-serif font
GAP, TITLE, LEGEND = 16, 18, 58  # px: between panels, a panel's title, the colour scale at the top
# ColorBrewer's "Blues" (Brewer 2003), white to dark blue: 21 levels, one per 0.05 of weight.
_BLUES = ("#f7fbff", "#deebf7", "#c6dbef", "#9dcae1", "#6aaed6", "#4191c6", "#2070b4", "#08509b", "#08306b")
_PNG_DPI = 72  # fixed, so the picture's size in pixels does not depend on the machine's matplotlib settings


def _ramp(n: int = 21) -> list[str]:
    """n colours from white to dark blue, interpolated in RGB between the 9 of ColorBrewer's Blues."""
    rgb = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in _BLUES]
    out = []
    for level in range(n):
        x = level / (n - 1) * (len(rgb) - 1)
        lo = min(int(x), len(rgb) - 2)
        t = x - lo
        out.append("#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(rgb[lo], rgb[lo + 1])))
    return out


COLORS = _ramp()


@dataclass
class Layout:
    """Where everything goes, in px. ``layers`` and ``heads``: what is drawn; T and S: tokens drawn."""

    layers: list[int]
    heads: int
    top: float
    T: int
    S: int
    cell: int
    cols: int
    left: float
    keys_h: float
    width: int
    height: int
    queries: list[str]
    keys: list[str]
    caption: str | None

    def block_h(self) -> float:
        """Height of one row of panels: its key labels, title and cells."""
        return self.keys_h + TITLE + self.T * self.cell + GAP

    def panel(self, n_layer: int, k: int) -> tuple[float, float]:
        """Top-left corner of the cells of head k of the n-th layer drawn."""
        rows_per_layer = math.ceil(self.heads / self.cols)
        row = n_layer * rows_per_layer + k // self.cols
        x = self.left + (k % self.cols) * (self.S * self.cell + GAP)
        y = self.top + row * self.block_h() + self.keys_h + TITLE
        return x, y


def layout(view) -> Layout:
    T_all, S_all, L, h = len(view.tokens), len(view.key_tokens), len(view.weights), view.h
    T, S = min(T_all, MAX_TOKENS), min(S_all, MAX_TOKENS)
    cell = 14 if max(T, S) <= 16 else 12
    queries = [display_label(t, MAX_LABEL) for t in view.tokens[:T]]
    keys = [display_label(t, MAX_LABEL) for t in view.key_tokens[:S]]
    left = 8 + CHAR * max(1, *map(len, queries))
    keys_h = 6 + CHAR * max(1, *map(len, keys))
    block_h = keys_h + TITLE + T * cell + GAP  # one row of heatmaps
    cols = max(1, min(h, int((WIDTH - left - 8 + GAP) // (S * cell + GAP))))
    fit = max(1, int((MAX_HEIGHT - LEGEND - 18) // block_h))  # rows of heatmaps that fit
    heads = min(h, fit * cols)
    cols = math.ceil(heads / math.ceil(heads / cols))  # balanced rows: 4 heads as 2 + 2, not 3 + 1
    layers = list(range(max(1, min(L, fit // math.ceil(heads / cols)))))
    rows = len(layers) * math.ceil(heads / cols)
    left_out = []
    if len(layers) < L or heads < h:
        which = f"the first {len(layers)} of {L} layers" + (f", the first {heads} of {h} heads" if heads < h else "")
        left_out.append(f"{len(layers) * heads} of {L * h} heatmaps ({which})")
    if T < T_all or S < S_all:
        left_out.append(f"the first {T} of {T_all} queries and {S} of {S_all} keys")
    caption = ("Shown: " + "; ".join(left_out) + ". The interactive view shows everything.") if left_out else None
    top = LEGEND + (18 if caption else 0)
    width = round(left + cols * (S * cell + GAP) - GAP + 8)
    width = max(width, 230, 16 + round(CHAR * len(caption)) if caption else 0)
    height = round(top + rows * block_h + 4)
    return Layout(layers, heads, top, T, S, cell, cols, left, keys_h, width, height, queries, keys, caption)


def _title(view, layer: int, k: int) -> str:
    name = view.layer_names[layer]
    return display_label(f"{name} · head {k}" if len(view.weights) > 1 else f"head {k}", 40)


def _level(permille: int) -> int:
    """The colour level (0-20) of a weight in thousandths: the nearest twentieth."""
    return (permille * 20 + 500) // 1000


def static_svg(view) -> str:
    """The static picture of ``view`` as an SVG document (see the module's docstring for what it shows)."""
    g = layout(view)
    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{g.width}" height="{g.height}" '
        f'viewBox="0 0 {g.width} {g.height}" font-family="sans-serif" font-size="{FONT}" direction="ltr">',
        f'<rect width="{g.width}" height="{g.height}" fill="#ffffff"/>',
    ]
    out += _legend_svg(g)
    for n, layer in enumerate(g.layers):
        w = view.weights[layer]
        for k in range(g.heads):
            x0, y0 = g.panel(n, k)
            out.append(f'<text x="{round(x0)}" y="{round(y0 - 5)}" fill="#222222">{esc(_title(view, layer, k))}</text>')
            for j, tok in enumerate(g.keys):  # key labels above every panel
                x, y = round(x0 + (j + 0.5) * g.cell + 4), round(y0 - TITLE - 4)
                out.append(f'<text transform="translate({x} {y}) rotate(-90)" fill="#222222">{esc(tok)}</text>')
            if k % g.cols == 0:  # query labels left of every row of panels
                for i, tok in enumerate(g.queries):
                    y = round(y0 + (i + 0.5) * g.cell + 4)
                    out.append(
                        f'<text x="{round(g.left - 4)}" y="{y}" text-anchor="end" fill="#222222">{esc(tok)}</text>'
                    )
            out += _cells_svg(w[k, : g.T, : g.S].tolist(), round(x0), round(y0), g.cell)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _cells_svg(rows: list[list[int]], x0: int, y0: int, c: int) -> list[str]:
    """One path per colour level; a run of equal cells in a row is one rectangle (a small SVG)."""
    paths: dict[int, list[str]] = {}
    for i, row in enumerate(rows):
        j = 0
        while j < len(row):
            level, start = _level(row[j]), j
            while j < len(row) and _level(row[j]) == level:
                j += 1
            n = (j - start) * c
            paths.setdefault(level, []).append(f"M{x0 + start * c} {y0 + i * c}h{n}v{c}h-{n}z")
    out = [f'<path d="{"".join(d)}" fill="{COLORS[level]}"/>' for level, d in sorted(paths.items())]
    width, height = c * (len(rows[0]) if rows else 0), c * len(rows)
    out.append(f'<rect x="{x0}" y="{y0}" width="{width}" height="{height}" fill="none" stroke="#999999"/>')
    return out


def _legend_svg(g: Layout) -> list[str]:
    """The colour scale: 21 swatches from weight 0 to 1, with ticks, and what the picture leaves out."""
    x0, y0, w = 8, 22, 10
    out = [f'<text x="{x0}" y="14" fill="#222222">attention weight (row: query, column: key)</text>']
    for level, color in enumerate(COLORS):
        out.append(f'<rect x="{x0 + level * w}" y="{y0}" width="{w}" height="12" fill="{color}"/>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{w * len(COLORS)}" height="12" fill="none" stroke="#999999"/>')
    for value in (0, 0.25, 0.5, 0.75, 1):
        x = round(x0 + (value * 20 + 0.5) * w)
        out.append(f'<text x="{x}" y="{y0 + 25}" text-anchor="middle" fill="#222222">{value:g}</text>')
    if g.caption:
        out.append(f'<text x="{x0}" y="{LEGEND + 6}" fill="#222222">{html.escape(g.caption)}</text>')
    return out


def static_png(view) -> bytes:
    """The same picture drawn by matplotlib (Agg, fixed dpi, no timestamp), as PNG bytes.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (names the extra to install).
    """
    fig = static_figure(view)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # A token in a script DejaVu Sans lacks is drawn as a box; the HTML view shows it properly.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.savefig(buf, format="png", dpi=_PNG_DPI, metadata={"Software": None})
    return buf.getvalue()


def static_figure(view):
    """The static picture as a matplotlib Figure (no pyplot: nothing is registered for display); every text in it
    is a :func:`mha.plot.labels.label`, drawn as written."""
    from ._optional import matplotlib_figure

    Figure = matplotlib_figure("the head view's PNG picture")
    from matplotlib.colors import ListedColormap

    g = layout(view)
    W, H = g.width, g.height
    fig = Figure(figsize=(W / _PNG_DPI, H / _PNG_DPI), dpi=_PNG_DPI)
    text = lambda x, y, s, **kw: fig.text(x / W, 1 - y / H, label(s), fontsize=FONT,  # noqa: E731
                                          color="#222222", usetex=False, **AS_WRITTEN, **kw)
    cmap = ListedColormap(COLORS)
    bar = fig.add_axes((8 / W, 1 - 34 / H, 21 * 10 / W, 12 / H))
    bar.imshow([list(range(21))], cmap=cmap, vmin=-0.5, vmax=20.5, aspect="auto")
    bar.set_xticks([]), bar.set_yticks([])
    text(8, 14, "attention weight (row: query, column: key)", va="baseline")
    for value in (0, 0.25, 0.5, 0.75, 1):
        text(8 + (value * 20 + 0.5) * 10, 47, f"{value:g}", ha="center", va="baseline")
    if g.caption:
        text(8, LEGEND + 6, g.caption, va="baseline")
    for n, layer in enumerate(g.layers):
        w = view.weights[layer]
        for k in range(g.heads):
            x0, y0 = g.panel(n, k)
            ax = fig.add_axes((x0 / W, 1 - (y0 + g.T * g.cell) / H, g.S * g.cell / W, g.T * g.cell / H))
            levels = ((w[k, : g.T, : g.S] * 20 + 500) // 1000).numpy()
            ax.imshow(levels, cmap=cmap, vmin=-0.5, vmax=20.5, interpolation="nearest", aspect="auto")
            ax.set_xticks([]), ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_color("#999999")
            text(x0, y0 - 5, _title(view, layer, k), va="baseline")
            for j, tok in enumerate(g.keys):
                text(x0 + (j + 0.5) * g.cell, y0 - TITLE - 4, tok, rotation=90, ha="center", va="bottom")
            if k % g.cols == 0:
                for i, tok in enumerate(g.queries):
                    text(g.left - 4, y0 + (i + 0.5) * g.cell, tok, ha="right", va="center")
    return fig
