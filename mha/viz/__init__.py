"""Pictures of attention, around the lesson's core: heatmaps, the interactive head view, figure style.

- :mod:`mha.viz.heatmaps`: :func:`plot_heads` (one heatmap per head) and :func:`plot_mask` (a keep-mask);
- :mod:`mha.viz.head_view`: :func:`head_view`, an interactive view of every head (``head_view.js`` and
  ``head_view.css`` beside it), and :mod:`mha.viz.static`, its static picture for viewers without JavaScript;
- :mod:`mha.viz.style`: :func:`notebook_style`, figures and stored outputs that are the same on every machine.

Learners import them as ``mha.plot`` (``from mha.plot import head_view, plot_heads``), which re-exports these.
"""

from .head_view import HeadView, head_view
from .heatmaps import plot_heads, plot_mask
from .style import notebook_style

__all__ = ["HeadView", "head_view", "notebook_style", "plot_heads", "plot_mask"]
