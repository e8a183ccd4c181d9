"""Pictures of attention, around the lesson's core: heatmaps, the interactive head view, figure style.

- :mod:`mha.viz.heatmaps`: :func:`plot_heads` (one heatmap per head) and :func:`plot_mask` (a keep-mask);
- :mod:`mha.viz.head_view`: :func:`head_view`, an interactive view of every head (its script and style in
  ``head_view.js``, ``head_view_export.js`` and ``head_view.css`` beside it), with
  :mod:`mha.viz.payload` (its data, kept small at a real model's size), :mod:`mha.viz.static` (its
  static picture, for viewers without JavaScript) and :mod:`mha.viz.labels` (any token, drawable);
- :mod:`mha.viz.style`: :func:`notebook_style`, figures and stored outputs that are the same on every machine.

matplotlib is optional: the head view displays without it, and what draws with it imports it when it draws
(or says to ``pip install "mha[notebooks]"``). Learners import these as ``mha.plot``
(``from mha.plot import head_view, plot_heads``), which re-exports them.
"""

from .head_view import HeadView, head_view
from .heatmaps import plot_heads, plot_mask
from .style import notebook_style

__all__ = ["HeadView", "head_view", "notebook_style", "plot_heads", "plot_mask"]
