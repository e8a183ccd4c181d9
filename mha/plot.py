"""Pictures of attention: heatmaps per head, keep-masks, the interactive head view, figure style.

The names learners use (``from mha.plot import head_view, plot_heads``, ``mha.plot.notebook_style()``);
they live in the subpackage :mod:`mha.viz`. Masks everywhere are keep-masks: True or 1 means "this query
may attend to this key".
"""

from .viz import HeadView, head_view, notebook_style, plot_heads, plot_mask

__all__ = ["HeadView", "head_view", "notebook_style", "plot_heads", "plot_mask"]
