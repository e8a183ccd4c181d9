"""Figures that are the same on every machine: :func:`notebook_style`.

Needs matplotlib (``pip install "mha[notebooks]"``), imported when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._optional import matplotlib_figure, pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NOTEBOOK_RC = {"font.size": 13.0}  # matplotlib's default is 10; see notebook_style
#: Where a notebook's stored figure keeps the size of its smallest text (``tests/test_phone_figures.py`` reads it).
TEXT_KEY = "mha_smallest_text"


def notebook_style() -> None:
    """Make a notebook's figures, and the outputs Jupyter stores for them, the same on every machine.

    Two things vary from machine to machine (case C13 in the project's cases):

    - a local matplotlibrc can change the dpi, figure size and fonts: this resets
      matplotlib to its own defaults (``plt.style.use("default")``);
    - Jupyter stores a text form next to every figure's PNG, by default
      ``<Figure size 640x480 with 1 Axes>``, whose pixel size follows the dpi; strict
      nbval compares that text. Inside IPython this shows ``<Figure with 1 Axes>`` instead.

    On top of the defaults, text is 13 pt instead of 10 (``font.size``; titles, ticks
    and legends follow it), for phones: a phone shows a figure at most ~358 px wide, so
    text stays >= 9 px there on a figure up to 13 / 1.8 = 7 inches wide. Inside IPython,
    each figure's stored PNG also records its smallest text in points and its dpi (in the
    output's metadata, which nbval does not compare), so that a test can check it.

    Call it once, before the first figure. Outside IPython only the style is reset.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (names the extra to install).
    """
    plt = pyplot("notebook_style")
    plt.style.use("default")
    plt.rcParams.update(NOTEBOOK_RC)
    # Resolve the backend now: Jupyter's inline backend, when it loads, drops every text
    # formatter registered for figures, so ours must come after it.
    plt.switch_backend(plt.get_backend())
    try:
        from IPython import get_ipython
    except ImportError:  # matplotlib without IPython: nothing is stored
        return
    shell = get_ipython()
    if shell is not None:
        figure = matplotlib_figure("notebook_style")
        formatters = shell.display_formatter.formatters
        formatters["text/plain"].for_type(figure, _figure_text)
        try:
            draw = formatters["image/png"].lookup_by_type(figure)
        except KeyError:  # no inline backend: no PNG is stored
            return
        draw = getattr(draw, "draws", draw)  # called again: wrap the inline backend's printer, not ours
        formatters["image/png"].for_type(figure, _Recording(draw))


def _figure_text(fig: Figure, printer, cycle: bool) -> None:
    printer.text(f"<Figure with {len(fig.axes)} Axes>")


class _Recording:
    """The inline backend's PNG printer, and the figure's smallest drawn text as the PNG's metadata."""

    def __init__(self, draws):
        self.draws = draws

    def __call__(self, fig: Figure):
        from matplotlib.text import Text

        png = self.draws(fig)  # draws the figure: its tick labels exist now
        shown = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and _drawn(t)]
        if png is None or not shown:
            return png
        smallest = min(shown, key=lambda t: t.get_fontsize())
        return png, {TEXT_KEY: {"points": round(float(smallest.get_fontsize()), 2), "dpi": float(fig.dpi),
                                "text": smallest.get_text()[:40]}}


def _drawn(text) -> bool:
    """False for a tick label outside its axis' view (matplotlib keeps such ticks but does not draw them)."""
    axes = text.axes
    if axes is None:
        return True
    for axis in (axes.xaxis, axes.yaxis):
        for tick in axis.majorTicks + axis.minorTicks:
            if text is tick.label1 or text is tick.label2:
                low, high = sorted(axis.get_view_interval())
                loc = tick.get_loc()
                return tick.get_visible() and loc is not None and low - 1e-9 <= loc <= high + 1e-9
    return True
