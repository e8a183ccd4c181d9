"""mha.plot.head_view: what it stores (the same bytes for the same rounded content, so strict nbval passes), what it
draws, what it refuses, and its size at a real model's (C16). In a browser: tests/test_head_view_browser.py."""

import base64
import importlib.resources
import io
import json
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")

import matplotlib.image  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import assert_close  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mha  # noqa: E402
from mha.plot import head_view  # noqa: E402
from mha.plot.head_view import PALETTE, HeadView  # noqa: E402
from mha.plot.labels import _INVISIBLE as INVISIBLE  # noqa: E402
from mha.plot.labels import display_label  # noqa: E402
from mha.plot.static import COLORS, MAX_LABEL  # noqa: E402

TOKENS = ["the", "cat", "sat", "on", "the", "mat"]


def layer_weights(seed=0, h=4, T=6):
    torch.manual_seed(seed)
    _, w = mha.MultiHeadAttention(8 * h, h)(torch.randn(1, T, 8 * h))  # (1, h, T, T), causal
    return w


class Parts(HTMLParser):
    """The view's HTML, taken apart: tags seen, the JSON data, the script, the static image."""

    def __init__(self, text):
        super().__init__()
        self.tags, self.data, self.script, self.img, self._in = [], None, None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "script":
            self._in = "data" if attrs.get("type") == "application/json" else "script"
        if tag == "img":
            self.img = attrs["src"]

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = None

    def handle_data(self, data):
        if self._in == "data":
            self.data = json.loads(data)
        elif self._in == "script":
            self.script = data


def test_html_stores_the_rounded_weights_tokens_and_names():
    w0, w1 = layer_weights(0)[0], layer_weights(1)[0]  # two layers, (4, 6, 6) each
    view = head_view([w0, w1[None]], TOKENS, layer_names=["first", "second"])
    assert repr(view) == "HeadView(2 layers, 4 heads, 6 queries x 6 keys)" and isinstance(view, HeadView)
    parts = Parts(view.to_html())
    data = parts.data
    assert data["queries"] == data["keys"] == TOKENS and data["colors"] == list(PALETTE[:4])
    assert [layer["name"] for layer in data["layers"]] == ["first", "second"]
    for layer, w in zip(data["layers"], (w0, w1)):  # (h, T, S) each, rounded to 3 decimals
        assert_close(torch.tensor(layer["w"], dtype=torch.float64) / data["scale"], w.double(), atol=0.0005 + 1e-12)
    # The root carries the content hash; nothing else in the HTML has an id.
    roots = [a for t, a in parts.tags if a.get("class") == "mha-hv"]
    assert len(roots) == 1 and roots[0]["data-mha-hv"] == view.key and re.fullmatch(r"[0-9a-f]{12}", view.key)
    assert not [a for _, a in parts.tags if "id" in a]
    assert parts.script.rstrip().endswith(f'("{view.key}");')


def test_output_is_deterministic_and_depends_only_on_the_rounded_content():
    w = layer_weights()[0].double()
    a, b = head_view(w, TOKENS), head_view(w.clone(), TOKENS)
    assert a.to_html() == b.to_html()  # (the PNG's bytes: the save test)
    rounded = torch.round(w * 1000) / 1000  # the same numbers to 3 decimals, the bits differ
    jitter = torch.where(w > 0, rounded + 1e-6, rounded)
    assert not torch.equal(jitter, w) and head_view(jitter, TOKENS).to_html() == a.to_html()
    other = w.clone()
    other[0, 5] = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.1, 0.1], dtype=torch.float64)
    changed = head_view(other, TOKENS)
    assert changed.key != a.key and changed.to_html() != a.to_html()
    assert head_view(w, TOKENS, layer_names=["attn"]).key != a.key


def test_html_loads_nothing_and_has_no_global_script_tricks():
    text = head_view(layer_weights(), TOKENS).to_html()
    parts = Parts(text)
    for tag, attrs in parts.tags:
        for name in ("src", "href"):
            value = attrs.get(name)
            assert value is None or value.startswith("data:"), (tag, name, value)
    # The only URL is the SVG namespace, which names and never loads anything.
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) == {"http://www.w3.org/2000/svg"}
    for banned in ("require(", "define(", "import(", "fetch(", "XMLHttpRequest", "Math.random", "Date.now"):
        assert banned not in text
    for name in ("head_view.js", "head_view_export.js", "head_view.css"):  # nothing in them ends the inline script
        asset = importlib.resources.files("mha.plot").joinpath(name).read_text(encoding="utf-8").lower()
        assert "</script" not in asset and "<!--" not in asset and "</style" not in asset, name


def test_static_picture_is_svg_with_one_panel_per_layer_and_head_and_a_colour_scale():
    view = head_view([layer_weights(0), layer_weights(1)], TOKENS)
    src = Parts(view.to_html()).img
    assert src.startswith("data:image/svg+xml;base64,")
    svg = base64.b64decode(src.split(",", 1)[1]).decode()
    assert svg == view.to_svg()
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(ns + "text")]
    assert [t for t in texts if "head" in t] == [f"layer {layer} · head {k}" for layer in range(2) for k in range(4)]
    assert texts.count("the") == 8 * 2 + 2 * 2  # key labels above 8 panels, query labels left of 2 rows of them
    # The colour scale: 21 swatches from white to dark blue, ticks 0 to 1; the cells use its colours.
    swatches = [r.get("fill") for r in root.iter(ns + "rect") if r.get("height") == "12" and r.get("fill") != "none"]
    assert swatches == list(COLORS) and COLORS[0] == "#f7fbff" and COLORS[-1] == "#08306b"
    assert {"0", "0.5", "1"} <= set(texts)
    fills = {p.get("fill") for p in root.iter(ns + "path")}
    assert fills <= set(COLORS) and COLORS[-1] in fills  # weight 1, top-left of every causal table
    # Readable: cells of 14 px at 6 tokens, and no wider than a notebook's output column.
    assert int(root.get("width")) <= 960


# Strings a tokenizer can produce: markup, entities, mathtext, control characters (NUL, newline, an ANSI
# escape, C1's NEL), line and paragraph separators, right-to-left text and bidi controls, emoji sequences,
# lone surrogates (a byte-level token cut mid-character), noncharacters, empty and very long strings.
NASTY = [
    "</script><script>alert(1)</script>", "</SCRIPT >", "<!--", "-->", "<b>", "&amp;", "a & b", '"q"', "'", "$x$",
    "\\", "\x00", "\n", "\r\n", "\t", "\x1b[31m", "\x85", "\u2028", "\u2029", "\u202e", "\u2066", "שלום", "مرحبا",
    "\u200f!", "😀", "👩\u200d👩\u200d👧", "\ud800", "\udfff", "\udc80abc", "\ufffe", "\uffff", "", " ", "x" * 1000,
    "e\u0301", "\U0010ffff",
]
ANY_CHARACTER = st.characters(exclude_categories=())  # every code point, lone surrogates included
TOKEN = st.one_of(st.sampled_from(NASTY), st.text(ANY_CHARACTER, max_size=40))


def drawn_texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


@given(tokens=st.lists(TOKEN, min_size=1, max_size=6), name=TOKEN)
def test_any_token_keeps_the_html_and_the_static_picture_valid(tokens, name):
    T = len(tokens)
    w = torch.softmax(torch.arange(2 * T * T, dtype=torch.float64).reshape(2, T, T).sin(), dim=-1)
    view = head_view(w, tokens, layer_names=[name])
    text = view.to_html()
    text.encode("utf-8")  # strict: no lone surrogate reaches the output
    parts = Parts(text)
    assert parts.data["queries"] == tokens and parts.data["layers"][0]["name"] == name  # kept exactly
    assert [tag for tag, _ in parts.tags].count("script") == 2  # no token opened or closed a script
    assert parts.script.rstrip().endswith(f'("{view.key}");')
    svg = base64.b64decode(parts.img.split(",", 1)[1]).decode("utf-8")
    drawn = drawn_texts(svg)  # parses: well-formed XML, every character one XML allows
    labels = [display_label(t, MAX_LABEL) for t in tokens]
    assert set(labels) <= set(drawn) and all(len(label) <= MAX_LABEL for label in labels)
    assert not INVISIBLE.search("".join(drawn))


def test_labels_show_what_is_invisible_and_cut_what_is_long():
    assert display_label("a\nb\t", 16) == "a\u240ab\u2409"  # control characters as their symbols
    assert display_label("\x00\x7f\x85", 16) == "\u2400\u2421\\x85"
    assert display_label("\udc80ok", 16) == "\\udc80ok"  # a lone surrogate as an escape
    assert display_label("😀שלום", 16) == "😀שלום"  # drawable text stays as it is
    assert display_label("x" * 30, 16) == "x" * 15 + "…"
    assert display_label("", 16) == ""


def test_accepts_grad_half_precision_masked_rows_and_cross_attention():
    cross = torch.softmax(torch.randn(2, 3, 5), dim=-1)  # (h, T, S): 3 queries, 5 keys
    assert Parts(head_view(cross, ["a", "b", "c"], key_tokens=list("vwxyz")).to_html()).data["keys"] == list("vwxyz")
    w = layer_weights()
    blocked = w.detach().clone()
    blocked[0, :, 2] = 0.0  # a query whose keys were all masked: mha gives it zero weights
    for weights in (w, w.detach().half(), w.detach().bfloat16(), blocked):
        stored = torch.tensor(Parts(head_view(weights, TOKENS).to_html()).data["layers"][0]["w"]).double() / 1000
        assert_close(stored, weights[0].detach().double(), atol=0.004)  # bfloat16 keeps 3 digits


R = torch.rand(4, 6, 6)
BAD = [  # (weights, tokens, other arguments, exception, regex that the message must match)
    (torch.rand(6, 6), TOKENS, {}, ValueError, r"must be \(h, T, S\) or \(1, h, T, S\), got shape \(6, 6\)"),
    (torch.rand(2, 4, 6, 6), TOKENS, {}, ValueError, r"a batch of 2; .* pass w\[b\]"),
    (torch.rand(1, 1, 4, 6, 6), TOKENS, {}, ValueError, r"got shape \(1, 1, 4, 6, 6\)"),
    (torch.rand(0, 6, 6), TOKENS, {}, ValueError, "must all be at least 1"), ([], TOKENS, {}, ValueError, "empty list"),
    ([R, torch.rand(2, 6, 6)], TOKENS, {}, ValueError, r"weights\[0\] is \(4, 6, 6\), weights\[1\] is \(2, 6, 6\)"),
    (torch.full((4, 6, 6), float("nan")), TOKENS, {}, ValueError, "contains NaN"),
    (torch.randn(4, 6, 6) * 3, TOKENS, {}, ValueError, r"must lie in \[0, 1\].*scores before the softmax"),
    (torch.full((4, 6, 6), 1.25), TOKENS, {}, ValueError, "from 1.25 to 1.25: .* training mode with dropout"),
    ([[0.5, 0.5]], TOKENS, {}, TypeError, "must be a torch.Tensor"), ("w", TOKENS, {}, TypeError, "must be a torch"),
    (torch.ones(4, 6, 6, dtype=torch.int64), TOKENS, {}, TypeError, "floating point"),
    ([R, "x"], TOKENS, {}, TypeError, r"weights\[1\] must be a torch.Tensor"),
    (torch.rand(2, 3, 5), ["a", "b", "c"], {}, ValueError, "3 queries but 5 keys: pass key_tokens"),
    (R, TOKENS[:5], {}, ValueError, r"tokens has 5 labels but T \(the number of queries\) is 6"),
    (R, "the cat sat on the mat", {}, TypeError, r"one string .*\.split\(\)"),
    (R, ["a", "b", 3, "d", "e", "f"], {}, TypeError, r"tokens\[2\] must be a string, got int"),
    (R, 6, {}, TypeError, "must be a list of strings, got int"),
    (R, TOKENS, {"key_tokens": ["a", "b"]}, ValueError, r"key_tokens has 2 labels but S \(the number of keys\) is 6"),
    (R, TOKENS, {"layer_names": ["a", "b"]}, ValueError, "layer_names has 2 labels but the number of layers is 1"),
]


@pytest.mark.parametrize("weights, tokens, kwargs, error, match", BAD)
def test_bad_weights_and_labels_raise_naming_what_they_should_be(weights, tokens, kwargs, error, match):
    with pytest.raises(error, match=match):
        head_view(weights, tokens, **kwargs)


def test_save_writes_html_svg_or_png_by_suffix_in_any_case_and_refuses_others(tmp_path):
    view = head_view(layer_weights(), TOKENS)
    for suffix in ("html", "Svg", "PNG"):  # the suffix in any case (it was refused in capitals)
        view.save(tmp_path / f"v.{suffix}")
    page = (tmp_path / "v.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and view.to_html() in page
    assert (tmp_path / "v.Svg").read_text(encoding="utf-8") == view.to_svg()
    png = (tmp_path / "v.PNG").read_bytes()
    assert png == view.to_png()  # the same bytes from the same content
    root = ET.fromstring(view.to_svg())  # the PNG draws its picture, at a fixed dpi, with no metadata (no date)
    size = (int(root.get("width")), int(root.get("height")))
    assert b"tEXt" not in png and b"Software" not in png and struct.unpack(">II", png[16:24]) == size
    pixels = matplotlib.image.imread(io.BytesIO(png))  # (H, W, 4) floats in [0, 1]
    colours = {tuple(round(c * 255) for c in px[:3]) for px in pixels.reshape(-1, 4)}
    for hex_colour in (COLORS[-1], COLORS[10]):  # weight 1 (top-left cells), and the colour scale's middle
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        assert any(max(abs(a - b) for a, b in zip(rgb, c)) <= 2 for c in colours), hex_colour
    with pytest.raises(ValueError, match=r"\.html, \.svg or \.png"):
        view.save(tmp_path / "v.pdf")


def gpt2_shaped_weights(n_layers, h, T, seed=0):
    """Causal weights of untrained layers with GPT-2 small's head width (d_k 64) and a residual, as the
    benchmark measures (benchmarks/display.py): thinly spread, the hardest case for a sparse view."""
    torch.manual_seed(seed)
    x = torch.randn(1, T, 64 * h)
    tables = []
    with torch.no_grad():
        for _ in range(n_layers):
            y, w = mha.MultiHeadAttention(64 * h, h)(x)
            x = x + y
            tables.append(w[0])
    return tables


def unpack(layer, h, T, S):
    """A view's stored layer back as an (h, T, S) table of thousandths, as head_view.js reads it."""
    if "w" in layer:
        return torch.tensor(layer["w"])
    table = torch.zeros(h, T, S, dtype=torch.int64)
    for k, rows in enumerate(layer["rows"]):
        for i, row in enumerate(rows):
            table[k, i, row[0::2]] = torch.tensor(row[1::2], dtype=torch.int64)
    return table


@pytest.mark.slow  # about 4 s
def test_C16_a_gpt2_sentence_and_512_tokens_display_small_without_drawing_a_png():
    """Case C16 without timing (the times are benchmark figures, benchmarks/RESULTS.md): what is displayed
    and stored at 12 layers x 12 heads x 24 tokens and at 12 heads x 512 tokens."""
    from mha.plot.payload import SPARSE_BUDGET

    for n_layers, h, T, limit in ((12, 12, 24, 1.0e6), (1, 12, 512, 3.0e6)):
        weights = gpt2_shaped_weights(n_layers, h, T)
        tokens = [f"t{i}" for i in range(T)]
        view = head_view(weights, tokens)
        bundle = view._repr_mimebundle_()
        assert set(bundle) == {"text/html", "text/plain"}  # no PNG drawn: it took most of the 27 s
        size = sum(len(v.encode()) for v in bundle.values())
        assert size < limit, (n_layers, h, T, size)
        parts = Parts(bundle["text/html"])
        for layer, w in zip(parts.data["layers"], weights):
            stored, exact = unpack(layer, h, T, T), torch.round(w.double() * 1000).long()
            kept = stored > 0
            assert torch.equal(stored[kept], exact[kept])  # whatever is stored is the rounded weight
            missing = exact[~kept]
            assert missing.numel() == 0 or missing.max() < 10  # left out: weights below 0.010 only
            assert torch.equal(stored.max(-1).values, exact.max(-1).values)  # every row keeps its largest
        # The static picture is trimmed to what reads at its size, and says what it leaves out.
        svg = base64.b64decode(parts.img.split(",", 1)[1]).decode()
        root, texts = ET.fromstring(svg), drawn_texts(svg)
        panels, caption = [t for t in texts if " head " in t], [t for t in texts if t.startswith("Shown")]
        if T == 24:
            assert "w" in parts.data["layers"][0] and "note" not in parts.data  # small enough: every weight
            assert len(panels) == 12 and caption == [
                "Shown: 12 of 144 heatmaps (the first 1 of 12 layers). The interactive view shows everything."]
        else:
            assert "rows" in parts.data["layers"][0]
            assert parts.data["note"].startswith("Large view: weights below 0.010 are left out")
            assert sum(len(r) // 2 for rows in parts.data["layers"][0]["rows"] for r in rows) <= SPARSE_BUDGET
            assert caption == ["Shown: the first 32 of 512 queries and 32 of 512 keys. "
                               "The interactive view shows everything."]
        assert int(root.get("height")) <= 2800 and int(root.get("width")) <= 960


def test_a_large_view_of_peaked_weights_raises_its_floor_to_stay_small():
    from mha.plot.payload import SPARSE_BUDGET

    torch.manual_seed(0)
    favourites = torch.rand(16, 512, 512).argsort(-1)[..., :60]  # 60 keys per row get about 0.015 each
    w = torch.softmax(torch.zeros(16, 512, 512).scatter_(-1, favourites, 4.0), dim=-1)
    assert int((torch.round(w * 1000) >= 10).sum()) > SPARSE_BUDGET
    view = head_view(w, [str(i) for i in range(512)])
    data = json.loads(view.payload)
    kept = sum(len(r) // 2 for rows in data["layers"][0]["rows"] for r in rows)
    floor = float(re.search(r"weights below (\d\.\d+)", data["note"]).group(1))
    assert floor > 0.01 and kept <= SPARSE_BUDGET and f"{kept:,} of {16 * 512 * 512:,}" in data["note"]
    assert len(view.to_html().encode()) < 3e6


WITHOUT_MATPLOTLIB = """
import sys

class NoMatplotlib:  # as if it were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoMatplotlib())
import torch
import mha.plot
from mha.plot import head_view, notebook_style, plot_heads, plot_mask

view = head_view(torch.full((2, 3, 3), 1 / 3), ["a", "b", "c"])
assert set(view._repr_mimebundle_()) == {"text/html", "text/plain"} and "<svg" in view.to_svg()
view.save(sys.argv[1] + "/view.html")
for call in (view.to_png, lambda: view.save(sys.argv[1] + "/view.png"), lambda: plot_heads(torch.full((1, 2, 2), 0.5)),
             lambda: plot_mask(torch.ones(2, 2)), notebook_style):
    try:
        call()
    except ModuleNotFoundError as err:
        print(err)
assert "matplotlib" not in sys.modules
"""


@pytest.mark.slow
def test_the_head_view_works_without_matplotlib_and_pictures_name_the_extra(tmp_path):
    result = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and not result.stderr, result.stderr[-3000:]
    expected = [f'{what} needs matplotlib, which is not installed: pip install "mha[notebooks]"'
                for what in ("the head view's PNG picture",) * 2 + ("plot_heads", "plot_mask", "notebook_style")]
    assert result.stdout.splitlines() == expected
    assert (tmp_path / "view.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
