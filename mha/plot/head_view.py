"""An interactive head view: hover or click a token to see what every head attends to.

``mha.plot.head_view(weights, tokens)`` returns a :class:`HeadView`. Jupyter, VS Code and Colab display it
as one output bundle:

- ``text/html``: the interactive view, in plain HTML, CSS and JavaScript (``head_view.js``,
  ``head_view_export.js`` and ``head_view.css`` beside this file, inlined). It loads nothing: no CDN, no
  require.js, no network. Where the JavaScript does not run (GitHub's viewer, an untrusted notebook) the
  same HTML shows a static picture instead, an SVG written by :mod:`mha.plot.static`, inlined as a data URI.
- ``text/plain``: one line naming the sizes.

No ``image/png``: front-ends show the HTML, and drawing a PNG of 144 heatmaps took most of the 27 s a
GPT-2-small view needed to display (case C16). :meth:`HeadView.to_png` and ``save("view.png")`` draw the
static picture with matplotlib when a PNG file is wanted. A big view stays small (:mod:`mha.plot.payload`).

Every output is a function of the weights rounded to 3 decimals, the tokens and the layer names: the same
input gives byte-identical HTML on any machine (the element key is a hash of that content, not a random
id), so strict ``pytest --nbval`` passes. Nothing in the display needs matplotlib.

Prior art: bertviz's head view (Vig, "A Multiscale Visualization of Attention in the Transformer Model",
ACL 2019 demo, https://github.com/jessevig/bertviz). This one is written from scratch, so that it needs
neither require.js nor a CDN and shows a picture where JavaScript is stripped.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Sequence
from importlib import resources

import torch

from .labels import not_one_string
from .payload import layers_data

#: Head colours: Okabe and Ito's colour-blind-safe palette without black (it vanishes in dark themes).
#: Heads past the seventh reuse the colours; the cells beside each token are always in head order.
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#F0E442")

DECIMALS = 3  # weights are stored and shown to 3 decimals: enough to see, and stable across machines
_SCALE = 10**DECIMALS
_TOLERANCE = 1e-4  # softmax rows in float16 overshoot 1 by a few ulps


class HeadView:
    """Attention weights of one or more layers, ready to display as an interactive head view.

    Build it with :func:`head_view`. Displaying it (the last expression of a notebook cell, or
    ``IPython.display.display(view)``) shows the interactive view; :meth:`to_html`, :meth:`to_png`,
    :meth:`to_svg` and :meth:`save` give the same content as strings, bytes or files.

    Attributes:
        weights: list of (h, T, S) int64 tensors, one per layer: the weights in thousandths
            (1000 = weight 1.0), as stored and shown.
        tokens: the T query labels. key_tokens: the S key labels. layer_names: one per layer.
        note: what a large view's data leaves out (see :mod:`mha.plot.payload`), or None.
        payload: the JSON the view's script reads.
        key: a 12-hex-digit hash of the payload; the HTML's element key.
    """

    def __init__(self, weights, tokens, key_tokens, layer_names):
        self.weights = weights
        self.tokens = list(tokens)
        self.key_tokens = list(key_tokens)
        self.layer_names = list(layer_names)
        layers, self.note = layers_data(self.weights, self.layer_names)
        data = {
            "version": 2,
            "queries": self.tokens,
            "keys": self.key_tokens,
            "colors": [PALETTE[i % len(PALETTE)] for i in range(self.h)],
            "scale": _SCALE,
            "layers": layers,
        }
        if self.note:
            data["note"] = self.note
        self.payload = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
        self.key = hashlib.sha256(self.payload.encode()).hexdigest()[:12]

    @property
    def h(self) -> int:
        return self.weights[0].shape[0]

    def __repr__(self) -> str:
        n = len(self.weights)
        return (
            f"HeadView({n} layer{'s' if n != 1 else ''}, {self.h} head{'s' if self.h != 1 else ''}, "
            f"{len(self.tokens)} queries x {len(self.key_tokens)} keys)"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": self.to_html(), "text/plain": repr(self)}

    def to_html(self) -> str:
        """The interactive view as an HTML fragment (no ``<html>`` or ``<head>``), self-contained."""
        css = _asset("head_view.css")
        js = _script()
        data = _json_for_script(self.payload)
        static = base64.b64encode(self.to_svg().encode()).decode()
        n_heads = f"{self.h} head{'s' if self.h != 1 else ''}"
        alt = html.escape(f"Attention weights, {n_heads} per layer, as heatmaps (static picture)")
        return (
            f'<div class="mha-hv" data-mha-hv="{self.key}">\n'
            f"<style>\n{css}</style>\n"
            f'<div class="mha-hv-static"><img alt="{alt}" src="data:image/svg+xml;base64,{static}">'
            '<div class="mha-hv-note">Static picture: run the cell (or trust the notebook) for the '
            "interactive head view.</div></div>\n"
            '<div class="mha-hv-app" hidden></div>\n'
            f'<script type="application/json" class="mha-hv-data">{data}</script>\n'
            f'<script>\n{js.rstrip()}("{self.key}");\n</script>\n'
            "</div>\n"
        )

    def to_svg(self) -> str:
        """The static picture (one heatmap per layer and head) as an SVG document string."""
        from .static import static_svg

        return static_svg(self)

    def to_png(self) -> bytes:
        """The static picture drawn by matplotlib, as PNG bytes (same bytes for the same versions).

        Raises:
            ModuleNotFoundError: matplotlib is not installed (names the extra to install).
        """
        from .static import static_png

        return static_png(self)

    def save(self, path) -> None:
        """Write the view to ``path``: ``.html`` (a standalone interactive page), ``.svg`` or ``.png``.

        Raises:
            ValueError: the suffix is none of those three (in any case: ``.PNG`` is a PNG).
        """
        path = str(path)
        suffix = path.rsplit(".", 1)[-1].lower() if "." in path else ""
        if suffix == "html":
            page = (
                '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>head view</title></head>\n'
                f"<body>\n{self.to_html()}</body>\n</html>\n"
            )
            with open(path, "w", encoding="utf-8") as f:
                f.write(page)
        elif suffix == "svg":
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.to_svg())
        elif suffix == "png":
            with open(path, "wb") as f:
                f.write(self.to_png())
        else:
            raise ValueError(f"save writes .html, .svg or .png files, got {path!r}")


def head_view(
    weights,
    tokens: Sequence[str],
    *,
    key_tokens: Sequence[str] | None = None,
    layer_names: Sequence[str] | None = None,
) -> HeadView:
    """An interactive view of attention heads: hover or click a token to see where each head looks.

    Hover a query token (left column) to see what each head attends to *from* it, or a key token (right
    column) to see which queries attend *to* it; click to pin the selection, click again to release it.
    A line's opacity grows with its weight (the square root of it while a token is selected, so that
    weak links stay visible); the coloured cells beside each token show every head's weight, in head
    order, with opacity equal to the weight. Buttons toggle heads, a menu switches layers, and SVG / PNG
    export the current view. It works in JupyterLab, classic Notebook, VS Code, Colab and on the course
    website, offline: the HTML carries its own JavaScript and CSS and loads nothing. Where JavaScript is
    stripped (GitHub's notebook viewer) it shows a static picture of every head instead.

    Args:
        weights: attention weights, any float dtype and device, e.g. the ``w`` of
            ``y, w = mha.MultiHeadAttention(...)(x)``. One layer: (h, T, S), or (1, h, T, S) (a batch of
            one; pass ``w[b]`` for sample b of a larger batch). Several layers: a list of those, all of one
            shape. Every weight must lie in [0, 1] (softmax output: rows sum to 1, or 0 where every key is
            masked).
        tokens: T strings, the query tokens (the rows).
        key_tokens: S strings, the key tokens (the columns); default ``tokens``, which needs T == S.
            Cross-attention, or queries that are the last T of S tokens (a KV cache), need it.
        layer_names: one name per layer; default "layer 0", "layer 1", ...

    Returns:
        A :class:`HeadView`. Its HTML depends only on the weights rounded to 3 decimals, the tokens and
        the names, so a re-run stores the same notebook output (strict nbval passes).

    Raises:
        TypeError: weights is not a tensor (or a list of tensors), or not floating point; tokens,
            key_tokens or layer_names is a single string or holds something other than strings.
        ValueError: a tensor is not (h, T, S) or (1, h, T, S), layers differ in shape, a size is zero,
            weights are NaN or outside [0, 1] (scores before the softmax, say, or weights taken in
            training mode with dropout), or a label list does not match T, S or the number of layers.

    Source: the head view of bertviz (Vig, ACL 2019 demo track, https://github.com/jessevig/bertviz),
    here without require.js or a CDN, with a static fallback and image export.
    """
    layers = _as_layers(weights)
    h, T, S = layers[0].shape
    tokens = _labels(tokens, T, "tokens", "T (the number of queries)")
    if key_tokens is None:
        if S != T:
            raise ValueError(
                f"weights have {T} queries but {S} keys: pass key_tokens (S = {S} labels) as well as tokens"
            )
        key_tokens = tokens
    key_tokens = _labels(key_tokens, S, "key_tokens", "S (the number of keys)")
    if layer_names is None:
        layer_names = [f"layer {i}" for i in range(len(layers))]
    layer_names = _labels(layer_names, len(layers), "layer_names", "the number of layers")
    permille = [torch.round(w * _SCALE).to(torch.int64) for w in layers]
    return HeadView(permille, tokens, key_tokens, layer_names)


def _as_layers(weights) -> list[torch.Tensor]:
    """Check weights and return a list of (h, T, S) float64 CPU tensors."""
    if isinstance(weights, torch.Tensor):
        items, several = [weights], False
    elif isinstance(weights, (list, tuple)):
        items, several = list(weights), True
        if not items:
            raise ValueError("weights is an empty list: pass at least one layer's (h, T, S) weights")
    else:
        raise TypeError(
            f"weights must be a torch.Tensor (h, T, S) or a list of them, one per layer, got {type(weights).__name__}"
        )
    layers = []
    for i, w in enumerate(items):
        where = f"weights[{i}]" if several else "weights"
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{where} must be a torch.Tensor, got {type(w).__name__}")
        if not w.is_floating_point():
            raise TypeError(f"{where} must be floating point (softmax output), got {w.dtype}")
        if w.dim() == 4:
            if w.shape[0] != 1:
                raise ValueError(
                    f"{where} has shape {tuple(w.shape)}: a batch of {w.shape[0]}; the view shows one "
                    f"sequence, so pass {where.replace('weights', 'w')}[b] (h, T, S) for sample b"
                )
            w = w[0]
        if w.dim() != 3:
            raise ValueError(f"{where} must be (h, T, S) or (1, h, T, S), got shape {tuple(w.shape)}")
        if 0 in w.shape:
            raise ValueError(f"{where} has shape {tuple(w.shape)}: h, T and S must all be at least 1")
        if layers and w.shape != layers[0].shape:
            raise ValueError(
                f"all layers must have one shape (h, T, S): weights[0] is {tuple(layers[0].shape)}, "
                f"{where} is {tuple(w.shape)}"
            )
        w = w.detach().to("cpu", torch.float64)
        if bool(w.isnan().any()):
            raise ValueError(f"{where} contains NaN")
        lo, hi = w.min().item(), w.max().item()
        if lo < -_TOLERANCE or hi > 1 + _TOLERANCE:
            raise ValueError(
                f"{where} must lie in [0, 1] (softmax output), got values from {lo:.4g} to {hi:.4g}: "
                "scores before the softmax, or weights taken in training mode with dropout? Use model.eval()."
            )
        layers.append(w.clamp(0.0, 1.0))
    return layers


def _labels(labels, n: int, name: str, what: str) -> list[str]:
    not_one_string(labels, name)
    try:
        labels = list(labels)
    except TypeError:
        raise TypeError(f"{name} must be a list of strings, got {type(labels).__name__}") from None
    for i, s in enumerate(labels):
        if not isinstance(s, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(s).__name__} {s!r}")
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels but {what} is {n}")
    return labels


def _script() -> str:
    """head_view.js, one function expression, with head_view_export.js inlined where it says so."""
    return _asset("head_view.js").replace(_EXPORT, _asset("head_view_export.js").rstrip() + "\n")


_EXPORT = "/* mha: head_view_export.js */"


def _asset(name: str) -> str:
    return resources.files("mha.plot").joinpath(name).read_text(encoding="utf-8")


def _json_for_script(payload: str) -> str:
    """JSON that is safe inside <script>: no "</script>", "<!--" or "&" can end or open anything."""
    return payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
