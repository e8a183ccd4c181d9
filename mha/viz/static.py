"""The head view's static picture: one heatmap per layer and head, as SVG (inside the HTML) and PNG.

GitHub's notebook viewer strips JavaScript, so this picture is all a reader there sees.
"""

from __future__ import annotations

import html
import io
import warnings

from .head_view import _SCALE, PALETTE, HeadView

_PNG_DPI = 72  # fixed, so the picture's size does not depend on the machine's matplotlib settings




def _layout(view: HeadView):
    T, S = len(view.tokens), len(view.key_tokens)
    cell = 14 if max(T, S) <= 16 else 9 if max(T, S) <= 40 else 5
    char = 6.6  # px per character at 11 px, a generous average for a sans-serif font
    left = 8 + char * max(len(t) for t in view.tokens)
    top_keys = 8 + char * max(len(t) for t in view.key_tokens)
    gap, title = 16, 18
    return T, S, cell, left, top_keys, gap, title


def static_svg(view: HeadView) -> str:
    """Write the static picture of ``view`` as an SVG document, from the rounded weights alone.

    Deterministic by construction (plain string formatting of integers), so it can sit inside the
    notebook's HTML output without breaking strict nbval on another machine.
    """
    T, S, cell, left, top_keys, gap, title = _layout(view)
    h, n_layers = view.h, len(view.weights)
    panel_w, panel_h = S * cell, T * cell
    width = round(left + h * (panel_w + gap) + 8)
    row_h = title + panel_h + gap
    height = round(top_keys + n_layers * row_h + 4)
    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for k in range(h):  # key labels once, above every head's column of panels
        x0 = left + k * (panel_w + gap)
        for j, tok in enumerate(view.key_tokens):
            x, y = round(x0 + (j + 0.5) * cell + 3.5), round(top_keys - 4)
            out.append(f'<text transform="translate({x} {y}) rotate(-90)" fill="#222222">{esc(tok)}</text>')
    for layer, (name, w) in enumerate(zip(view.layer_names, view.weights)):
        y0 = top_keys + layer * row_h + title
        for i, tok in enumerate(view.tokens):
            y = round(y0 + (i + 0.5) * cell + 4)
            out.append(f'<text x="{round(left - 4)}" y="{y}" text-anchor="end" fill="#222222">{esc(tok)}</text>')
        for k in range(h):
            x0 = left + k * (panel_w + gap)
            color = PALETTE[k % len(PALETTE)]
            label = f"{name} · head {k}" if n_layers > 1 else f"head {k}"
            out.append(f'<text x="{round(x0)}" y="{round(y0 - 5)}" fill="#222222">{esc(label)}</text>')
            out.append(
                f'<rect x="{round(x0)}" y="{round(y0)}" width="{panel_w}" height="{panel_h}" '
                'fill="none" stroke="#bbbbbb"/>'
            )
            # One path per opacity level (in twentieths) keeps the SVG small.
            levels: dict[int, list[str]] = {}
            for i, row in enumerate(w[k].tolist()):
                for j, v in enumerate(row):
                    level = (v * 20 + _SCALE // 2) // _SCALE
                    if level:
                        levels.setdefault(level, []).append(
                            f"M{round(x0 + j * cell)} {round(y0 + i * cell)}h{cell}v{cell}h-{cell}z"
                        )
            for level in sorted(levels):
                out.append(f'<path d="{"".join(levels[level])}" fill="{color}" fill-opacity="{level / 20:g}"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def static_png(view: HeadView) -> bytes:
    """Draw the static picture of ``view`` with matplotlib (Agg, fixed dpi, no timestamp), as PNG bytes."""
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure  # not pyplot: nothing is registered for display

    T, S, cell, left, top_keys, gap, title = _layout(view)
    h, n_layers = view.h, len(view.weights)
    inch = 1 / _PNG_DPI
    fig = Figure(
        figsize=((left + h * (S * cell + gap) + 8) * inch, (top_keys + n_layers * (title + T * cell + gap)) * inch),
        dpi=_PNG_DPI,
        layout="constrained",
    )
    axes = fig.subplots(n_layers, h, squeeze=False)
    # "$" would start matplotlib's mathtext; an escaped "\$" is drawn as a plain dollar sign.
    tokens = [t.replace("$", r"\$") for t in view.tokens]
    keys = [t.replace("$", r"\$") for t in view.key_tokens]
    for layer, (name, w) in enumerate(zip(view.layer_names, view.weights)):
        for k in range(h):
            ax = axes[layer, k]
            cmap = LinearSegmentedColormap.from_list(f"head{k}", ["#ffffff", PALETTE[k % len(PALETTE)]])
            ax.imshow(w[k].numpy() / _SCALE, vmin=0.0, vmax=1.0, cmap=cmap, interpolation="nearest")
            label = f"{name} · head {k}" if n_layers > 1 else f"head {k}"
            ax.set_title(label.replace("$", r"\$"), fontsize=9, loc="left")
            ax.set_yticks(range(T), labels=tokens if k == 0 else [""] * T, fontsize=8)
            ax.set_xticks(range(S), labels=keys, fontsize=8, rotation=90)
            ax.xaxis.tick_top()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # A token in a script DejaVu Sans lacks is drawn as a box; the HTML view shows it properly.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.savefig(buf, format="png", dpi=_PNG_DPI, metadata={"Software": None})
    return buf.getvalue()
