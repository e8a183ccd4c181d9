"""Every figure in the notebooks reads on a 390 px phone (issue 29): its smallest text is at least 9 px there.

A phone shows a figure at most ~358 px wide (390 px less the page's margins), and a narrower PNG at its own size.
Text of F points in a PNG drawn at `dpi` is F * dpi / 72 pixels wide in the PNG, so on the phone it is
F * dpi / 72 * min(1, 358 / width) px. The width is read from the stored PNG itself; F and dpi are what
``mha.plot.notebook_style()`` recorded, when the figure was drawn, in the PNG output's metadata (which nbval does
not compare): the size of the smallest text the figure drew. A figure stored without that record fails too: the
notebook was executed before it, or without ``notebook_style()``; re-run ``notebooks/execute.py``.
"""

import base64
import json
import struct
from pathlib import Path

import nbformat
import pytest

from mha.plot.style import TEXT_KEY

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
PHONE_PX, LEAST_PX = 358, 9.0


def png_width(data: str) -> int:
    """The width in pixels from a base64 PNG's IHDR chunk (bytes 16-19, big-endian)."""
    png = base64.b64decode(data)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">I", png[16:20])[0]


def figures(path):
    """(cell index, PNG width, the recorded smallest text or None) for each matplotlib figure the notebook stores."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data and "".join(data.get("text/plain", "")).startswith("<Figure"):
                yield i, png_width(data["image/png"]), out.get("metadata", {}).get("image/png", {}).get(TEXT_KEY)


def on_a_phone(points: float, dpi: float, width: int) -> float:
    return points * dpi / 72 * min(1.0, PHONE_PX / width)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_every_figure_has_text_of_at_least_9_px_on_a_390_px_phone(path):
    small = []
    for cell, width, text in figures(path):
        assert text is not None, (f"{path.name}, cell {cell}: a figure stored without the size of its text; "
                                  "re-run it with notebooks/execute.py (mha.plot.notebook_style() records it)")
        shown = on_a_phone(text["points"], text["dpi"], width)
        if shown < LEAST_PX:
            needed = LEAST_PX * 72 / text["dpi"] * max(1.0, width / PHONE_PX)
            small.append(f"cell {cell}: {text['text']!r} at {text['points']} pt in a {width} px PNG shows at "
                         f"{shown:.1f} px; at this width it needs >= {needed:.1f} pt (or a narrower figure)")
    assert not small, f"{path.name}: text under {LEAST_PX:.0f} px on a phone:\n" + "\n".join(small)


SMALL_TEXT = """
import matplotlib.pyplot as plt
import mha.plot
mha.plot.notebook_style()
fig, ax = plt.subplots(figsize=(8.0, 3.0))
ax.plot([0, 1], [1, 0])
ax.set_title("a title at 20 pt", fontsize=20)
ax.set_xlabel("a label at 7 pt", fontsize=7)
ax.set_xticks([0, 1], ["0", "1"], fontsize=16)
ax.set_yticks([])
ax.set_xlim(0, 1)
plt.show()
"""


@pytest.mark.slow
def test_notebook_style_records_the_smallest_text_a_stored_figure_draws(tmp_path):
    """What the check above reads: the 7 pt label, not the 16 pt ticks or the 20 pt title, of an 8-inch figure."""
    from test_notebook_outputs import execute

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SMALL_TEXT)])
    nbformat.write(nb, tmp_path / "small.ipynb")
    execute.execute(tmp_path / "small.ipynb")
    ((_, width, text),) = list(figures(tmp_path / "small.ipynb"))
    assert (text["points"], text["dpi"], text["text"]) == (7.0, 100.0, "a label at 7 pt")
    assert 600 < width <= 800  # 8 inches at 100 dpi, trimmed to what is drawn
