"""Figures that are the same on every machine: :func:`notebook_style`.

Needs matplotlib (``pip install "mha[notebooks]"``), imported when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._optional import matplotlib_figure, pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NOTEBOOK_RC = {"font.size": 12.0}  # matplotlib's default is 10; see notebook_style


def notebook_style() -> None:
    """Make a notebook's figures, and the outputs Jupyter stores for them, the same on every machine.

    Two things vary from machine to machine (case C13 in the project's cases):

    - a local matplotlibrc can change the dpi, figure size and fonts: this resets
      matplotlib to its own defaults (``plt.style.use("default")``);
    - Jupyter stores a text form next to every figure's PNG, by default
      ``<Figure size 640x480 with 1 Axes>``, whose pixel size follows the dpi; strict
      nbval compares that text. Inside IPython this shows ``<Figure with 1 Axes>`` instead.

    On top of the defaults, text is 12 pt instead of 10 (``font.size``; titles, ticks
    and legends follow it): the website shows a figure scaled to its text column
    (about 650 px at a 1200 px window), so a 10-inch figure drawn at 100 dpi is shown
    at 65% and its text must start larger to stay readable there. The dpi stays
    matplotlib's 100, and with it the PNGs' size in bytes.

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
        shell.display_formatter.formatters["text/plain"].for_type(figure, _figure_text)


def _figure_text(fig: Figure, printer, cycle: bool) -> None:
    printer.text(f"<Figure with {len(fig.axes)} Axes>")
