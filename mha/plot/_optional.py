"""matplotlib is optional (the "notebooks" extra): import it when a picture needs it, or say what to install."""

from __future__ import annotations

INSTALL = 'pip install "mha[notebooks]"'


def _missing(what: str, err: ImportError) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"{what} needs matplotlib, which is not installed: {INSTALL}", name="matplotlib")


def pyplot(what: str):
    """``matplotlib.pyplot``, or ModuleNotFoundError naming ``what`` needs it and the extra to install."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise _missing(what, err) from err
    return plt


def matplotlib_figure(what: str):
    """``matplotlib.figure.Figure`` (no pyplot: nothing is registered for display), or the same error."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise _missing(what, err) from err
    return Figure
