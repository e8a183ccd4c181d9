"""mha.plot's heatmaps (plot_heads, plot_mask) and figure style, drawn with Agg, and every matplotlib surface of
mha.plot showing tokens as written (C31). The head view is in tests/test_head_view.py."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

import mha  # noqa: E402
from mha.plot import head_view, plot_heads, plot_mask  # noqa: E402
from mha.plot.static import static_figure  # noqa: E402

TEX = ["$_$", "cost", "$5", "$x$", "a_b", "x^2", "\\alpha", "\\"]  # mathtext would eat or crash on each but cost


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_plot_heads_draws_a_labelled_heatmap_per_head_on_one_colour_scale():
    w = torch.softmax(torch.randn(2, 4, 3, 5), -1)
    fig = plot_heads(w, ["a", "b", "c"], key_tokens=list("vwxyz"), batch_index=1, title="t")
    heat = [ax for ax in fig.axes if ax.images]
    assert len(heat) == 4 and len(fig.axes) == 5  # 4 heads + 1 colorbar (tick labels: the C31 tests below)
    limits = [ax.images[0].get_clim() for ax in heat]
    assert limits == [(0.0, pytest.approx(w[1].max().item()))] * 4  # one shared colour scale
    assert (heat[3].images[0].get_array() == w[1, 3].numpy()).all()
    assert [ax.get_title() for ax in heat] == ["head 0", "head 1", "head 2", "head 3"]


def test_plot_heads_wraps_heads_into_rows_and_its_axes_say_query_and_key():
    _, w = mha.MultiHeadAttention(24, 6)(torch.randn(1, 3, 24))
    assert w.requires_grad  # tensors that need grad are drawn as they are
    heat = [ax for ax in plot_heads(w[0], list("abc"), ncols=4).axes if ax.images]  # a 4 + 2 grid, empty slots removed
    assert len(heat) == 6
    assert [ax.get_ylabel() for ax in heat] == ["query", "", "", "", "query", ""]  # first column
    # the x label goes on the lowest heatmap of each column: heads 2 and 3 have none below them
    assert [ax.get_xlabel() for ax in heat] == ["", "", "key", "key", "key", "key"]


def test_plot_heads_scale_is_not_set_by_a_forced_row():
    # Under a causal mask row 0 sees one key and puts 1.0 on it, whatever the head does.
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    _, w = mha.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, 2, 5, 5)
    top_with_choice = w[0, :, 1:].max().item()  # rows 1..4 spread over 2 keys or more
    assert (w[0, :, 0, 0] == 1).all() and top_with_choice < 1
    images = [ax.images[0] for ax in plot_heads(w).axes if ax.images]
    assert [im.get_clim() for im in images] == [(0.0, pytest.approx(top_with_choice))] * 2
    assert images[0].get_array()[0, 0] == 1.0  # the forced weight is drawn (in the top colour), not dropped
    assert images[-1].colorbar.extend == "max"  # and the colorbar says that values lie above the scale


def test_plot_heads_colour_scale_tops_at_vmax_or_the_largest_weight():
    w = torch.eye(3).expand(2, 3, 3)  # every row forced onto one key: the scale falls back to the largest weight
    image = [ax for ax in plot_heads(w).axes if ax.images][-1].images[0]
    assert image.get_clim() == (0.0, 1.0) and image.colorbar.extend == "neither"
    assert [ax for ax in plot_heads(w * 0.25, vmax=0.5).axes if ax.images][-1].images[0].get_clim() == (0.0, 0.5)
    image = [ax for ax in plot_heads(torch.zeros(1, 2, 2)).axes if ax.images][0].images[0]
    assert image.get_clim() == (0.0, 1.0)  # all weights 0 (every key blocked): still a valid scale
    for bad in (0, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="vmax must be a positive finite number"):
            plot_heads(w, vmax=bad)


def test_plot_mask_draws_the_mask_as_0_and_1_with_its_labels():
    fig = plot_mask(mha.causal_mask(2, 5).int(), ["q0", "q1"], key_tokens=list("abcde"))
    (ax,) = fig.axes
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert ax.images[0].get_array().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


NAN = torch.full((1, 2, 4, 4), 0.25)
NAN[0, 1, 2, 3] = NAN[0, 1, 3, 0] = float("nan")


@pytest.mark.parametrize("call, error, message", [
    (lambda: plot_heads(torch.rand(1, 3, 3), ["a", "b"]), ValueError, "has 2 labels but T = 3"),
    # "abcd" passed as 4 labels (head_view refuses it), and NaN weights drawn as empty cells
    (lambda: plot_heads(torch.rand(2, 4, 4), "abcd"), TypeError, "tokens must be a list of strings, got one string"),
    (lambda: plot_heads(torch.rand(2, 4, 4), list("abcd"), key_tokens="wxyz"), TypeError, "one string 'wxyz': use"),
    (lambda: plot_mask(mha.causal_mask(4), "abcd"), TypeError, "tokens must be a list of strings, got one string"),
    (lambda: plot_heads(NAN, list("abcd")), ValueError, r"NaN \(2 of 32\), the first at head 1, query 2, key 3"),
    (lambda: plot_heads(torch.rand(3, 3)), ValueError, r"\(h, T, S\)"),
    (lambda: plot_heads(torch.rand(2, 3, 4, 4), batch_index=5), ValueError, "batch_index=5"),
    (lambda: plot_heads(torch.rand(2, 3, 4, 4), batch_index=True), TypeError, "batch_index must be an int"),
    (lambda: plot_heads(torch.rand(3, 4, 4), ncols=0), ValueError, "ncols"),
    (lambda: plot_heads(torch.rand(3, 4, 4), head_names=["a"]), ValueError, "head_names has 1 labels but h = 3"),
    (lambda: plot_mask(torch.full((2, 2), 0.5)), ValueError, "0 and 1"),
])
def test_plot_heads_and_plot_mask_refuse_wrong_labels_shapes_and_values(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_notebook_style_undoes_a_local_matplotlibrc():
    from mha.plot import notebook_style

    with matplotlib.rc_context({"figure.dpi": 72, "figure.figsize": (3.0, 2.0), "font.size": 7.0}):
        notebook_style()
        assert plt.rcParams["figure.dpi"] == matplotlib.rcParamsDefault["figure.dpi"] == 100
        assert list(plt.rcParams["figure.figsize"]) == list(matplotlib.rcParamsDefault["figure.figsize"])
        # Text 1.3 times matplotlib's default, so that it reads on a phone, where figures are scaled to
        # about 358 px; titles and ticks follow it.
        assert plt.rcParams["font.size"] == 1.3 * matplotlib.rcParamsDefault["font.size"] == 13
        fig = plot_heads(torch.softmax(torch.randn(4, 5, 5), -1), list("abcde"))
        heat = [ax for ax in fig.axes if ax.images]
        assert heat[0].title.get_fontsize() == 13
        assert heat[0].get_yticklabels()[0].get_fontsize() == pytest.approx(13 / 1.2, abs=0.01)  # "small"


def test_plot_heads_keeps_four_heads_within_a_page_width():
    w = torch.softmax(torch.randn(8, 5, 5), -1)
    assert plot_heads(w[:4]).get_size_inches()[0] <= 8.8  # 4 in a row
    assert plot_heads(w[:1]).get_size_inches()[0] == pytest.approx(2.6 + 0.8)  # one head keeps its size
    assert plot_heads(w[:4], size=3.0).get_size_inches()[0] == pytest.approx(4 * 3.0 + 0.8)  # as asked


def drawn_as_written(fig, texts, expected):
    """Draw fig; each text must read back as expected and take the room the renderer gives that string as plain
    text (as mathtext, "$x$" is one italic x and "$_$" does not draw at all)."""
    canvas = FigureCanvasAgg(fig)  # the static picture's Figure has no canvas of its own
    canvas.draw()
    renderer = canvas.get_renderer()
    assert [t.get_text() for t in texts] == expected
    for t in texts:
        width, _, _ = renderer.get_text_width_height_descent(t.get_text(), t.get_fontproperties(), ismath=False)
        box = t.get_window_extent(renderer)
        assert (box.height if t.get_rotation() == 90 else box.width) == pytest.approx(width, abs=0.5), t.get_text()


def test_C31_heatmap_tick_labels_and_titles_show_tex_as_written():
    """Case C31: a "$" in a token crashed plot_heads and plot_mask at draw time ("$_$"), or drew as math ("$x$")."""
    T = len(TEX)
    fig = plot_heads(torch.softmax(torch.randn(2, T, T), -1), TEX, head_names=["$a$", "b_1"], title="$x$ or $_$")
    ax = fig.axes[0]
    drawn_as_written(fig, ax.get_yticklabels() + ax.get_xticklabels(), TEX * 2)
    drawn_as_written(fig, [ax.title, fig.axes[1].title, fig._suptitle], ["$a$", "b_1", "$x$ or $_$"])
    fig = plot_mask(mha.causal_mask(T), TEX, title="^_^ $$")
    (ax,) = fig.axes
    drawn_as_written(fig, ax.get_yticklabels() + ax.get_xticklabels() + [ax.title], TEX * 2 + ["^_^ $$"])


def test_C31_the_head_views_static_picture_shows_tex_as_written():
    """Case C31's kind in the head view's PNG (matplotlib), with a layer name that holds TeX too."""
    T = len(TEX)
    fig = static_figure(head_view(torch.full((1, T, T), 1 / T), TEX, layer_names=["$L_0$"]))
    texts = [t for t in fig.texts if t.get_text() in TEX]
    drawn_as_written(fig, texts, [t.get_text() for t in texts])
    assert sorted({t.get_text() for t in texts}) == sorted(TEX)  # every token is among them
