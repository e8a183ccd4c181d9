"""Case C13: committed notebook outputs must not depend on the machine that made them.

What nbval (0.11, strict) compares, from its source (plugin.py, ``compare_outputs``): every stream, by name (a
stderr line fails a cell), with streams coalesced and carriage returns applied; and every MIME type of every
display_data and execute_result, *except* image/png and image/jpeg (unless --nbdime) and the output metadata.
So a figure's PNG is not compared, but the text/plain that comes with it is: ``<Figure size 460x400 with 1 Axes>``,
which is figsize x dpi, and fails under a matplotlibrc with ``figure.dpi: 72`` (``331.2x288``). ``plt.show()``
does not help: the inline backend still displays the figure with that text. image/svg+xml and text/html would be
compared too, and depend on fonts.

The notebooks therefore call ``mha.plot.notebook_style()`` before drawing: it resets matplotlib to its own
defaults and stores a figure's text as ``<Figure with 1 Axes>``, without the pixel size; they store only plain
text, PNGs and the head view's HTML. CI also runs nbval under a hostile matplotlibrc and terminal width (.ci/run).
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("execute", ROOT / "notebooks" / "execute.py")
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)

PINS_STYLE = re.compile(r"^\s*(mha\.plot\.)?notebook_style\(\)", re.MULTILINE)
COMPARED_AND_STABLE = {"text/plain", "image/png", "image/jpeg"}  # PNG/JPEG: not compared by nbval
TIMING = re.compile(r"\d(it/s|s/it)\b|\[\d\d:\d\d<|\d\s?(ms|µs|ns)\b")


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def is_figure(output):
    data = output.get("data", {})
    return "image/png" in data or "".join(data.get("text/plain", "")).startswith("<Figure")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_C13_figures_do_not_follow_the_local_matplotlibrc(path):
    """Before its first figure, a notebook resets matplotlib's rcParams (dpi, figure size...) to the defaults."""
    for cell in code_cells(path):
        if PINS_STYLE.search("".join(cell["source"])):
            return
        assert not any(is_figure(o) for o in cell["outputs"]), (
            f"{path.name}: a figure is drawn before mha.plot.notebook_style(); its stored "
            f"{''.join(next(o for o in cell['outputs'] if is_figure(o))['data'].get('text/plain', ''))!r} "
            "follows the local dpi"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_C13_checked_outputs_are_plain_text_or_png_without_addresses_or_timings(path):
    for cell in code_cells(path):
        src = "".join(cell["source"])
        if "NBVAL_IGNORE_OUTPUT" in src:
            continue
        for out in cell["outputs"]:
            kinds = set(out.get("data", {}))
            if kinds >= {"text/html"} and "".join(out["data"]["text/html"]).startswith('<div class="mha-hv"'):
                kinds.discard("text/html")  # mha.plot.head_view: built from rounded weights, ids from a content hash
            assert kinds <= COMPARED_AND_STABLE, f"{path.name}: nbval would compare {kinds - COMPARED_AND_STABLE}"
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            assert "<Figure size" not in text, f"{path.name}: a figure stored with its pixel size (dpi-dependent)"
            assert " at 0x" not in text, f"{path.name}: a memory address in {text[:120]!r}"
            assert "\r" not in text, f"{path.name}: stored with raw carriage returns (run notebooks/execute.py)"
            assert not TIMING.search(text), f"{path.name}: a timing in a checked cell: {text[:200]!r}"


FIGURE_CELL = (
    "import matplotlib.pyplot as plt\n{pin}"
    "fig, ax = plt.subplots(figsize=(4.6, 4.0))\nax.plot([0, 1], [1, 0])\nax.set_title('a line')\nplt.show()"
)


@pytest.mark.slow
def test_C13_a_local_dpi_fails_strict_nbval_unless_the_style_is_pinned(tmp_path, monkeypatch):
    """The failure of C13, reproduced with the real nbval, and the fix the notebooks use."""
    defaults, hostile = tmp_path / "defaults.rc", tmp_path / "hostile.rc"
    defaults.write_text("")
    hostile.write_text("figure.dpi: 72\nfigure.figsize: 3.0, 2.0\n")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mplconfig"))  # no personal matplotlibrc either
    monkeypatch.setenv("MATPLOTLIBRC", str(defaults))
    for name, pin in {"show_only": "", "pinned": "import mha.plot\nmha.plot.notebook_style()\n"}.items():
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FIGURE_CELL.format(pin=pin))])
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        execute.execute(tmp_path / f"{name}.ipynb")  # stored under matplotlib's defaults
    stored = nbformat.read(tmp_path / "show_only.ipynb", as_version=4).cells[0].outputs
    assert [o.data["text/plain"] for o in stored if is_figure(o)] == ["<Figure size 460x400 with 1 Axes>"]
    pinned = nbformat.read(tmp_path / "pinned.ipynb", as_version=4).cells[0].outputs
    assert [o.data["text/plain"] for o in pinned if is_figure(o)] == ["<Figure with 1 Axes>"]

    monkeypatch.setenv("MATPLOTLIBRC", str(hostile))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "--nbval",
                        "--nbval-current-env", "show_only.ipynb", "pinned.ipynb"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 passed" in r.stdout, r.stdout[-3000:]
    assert "FAILED show_only.ipynb" in r.stdout and "331.2x288" in r.stdout
