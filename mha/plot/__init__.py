"""Pictures of attention, around the lesson's core: heatmaps, the interactive head view, figure style.

- :mod:`mha.plot.heatmaps`: :func:`plot_heads` (one heatmap per head) and :func:`plot_mask` (a keep-mask);
- :mod:`mha.plot.flow`: :func:`plot_data_flow`, the layer from x to y with every shape (tall, for phones);
- :mod:`mha.plot.head_view`: :func:`head_view`, an interactive view of every head (its script and style in
  ``head_view.js``, ``head_view_export.js`` and ``head_view.css`` beside it), with
  :mod:`mha.plot.payload` (its data, kept small at a real model's size), :mod:`mha.plot.static` (its
  static picture, for viewers without JavaScript) and :mod:`mha.plot.labels` (any token, drawable);
- :mod:`mha.plot.style`: :func:`notebook_style`, figures and stored outputs that are the same on every machine.

matplotlib is optional: the head view displays without it, and what draws with it imports it when it draws
(or says to ``pip install "mha[notebooks]"``). Learners write ``from mha.plot import head_view, plot_heads``
and ``mha.plot.notebook_style()``.
"""

from .flow import plot_data_flow
from .head_view import HeadView, head_view
from .heatmaps import plot_heads, plot_mask
from .style import notebook_style

__all__ = ["HeadView", "head_view", "notebook_style", "plot_data_flow", "plot_heads", "plot_mask"]
