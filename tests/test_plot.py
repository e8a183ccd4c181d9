"""mha.plot returns figures with the structure the notebooks rely on."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import mha  # noqa: E402
from mha.plot import plot_heads, plot_mask  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_plot_heads_draws_a_labelled_heatmap_per_head_on_one_colour_scale():
    w = torch.softmax(torch.randn(2, 4, 3, 5), -1)
    fig = plot_heads(w, ["a", "b", "c"], key_tokens=list("vwxyz"), batch_index=1, title="t")
    heat = [ax for ax in fig.axes if ax.images]
    assert len(heat) == 4 and len(fig.axes) == 5  # 4 heads + 1 colorbar
    assert [t.get_text() for t in heat[0].get_yticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in heat[2].get_xticklabels()] == list("vwxyz")
    limits = [ax.images[0].get_clim() for ax in heat]
    assert limits == [(0.0, pytest.approx(w[1].max().item()))] * 4  # one shared colour scale
    assert (heat[3].images[0].get_array() == w[1, 3].numpy()).all()
    assert [ax.get_title() for ax in heat] == ["head 0", "head 1", "head 2", "head 3"]


def test_plot_heads_axes_say_query_and_key():
    fig = plot_heads(torch.softmax(torch.randn(6, 3, 3), -1), ncols=4)  # a 4 + 2 grid
    heat = [ax for ax in fig.axes if ax.images]
    assert [ax.get_ylabel() for ax in heat] == ["query", "", "", "", "query", ""]  # first column
    # the x label goes on the lowest heatmap of each column: heads 2 and 3 have none below them
    assert [ax.get_xlabel() for ax in heat] == ["", "", "key", "key", "key", "key"]


def test_plot_heads_scale_is_not_set_by_a_forced_row():
    # Under a causal mask row 0 sees one key and puts 1.0 on it, whatever the head does.
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    _, w = mha.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, 2, 5, 5)
    assert (w[0, :, 0, 0] == 1).all()
    top_with_choice = w[0, :, 1:].max().item()  # rows 1..4 spread over 2 keys or more
    assert top_with_choice < 1
    images = [ax.images[0] for ax in plot_heads(w).axes if ax.images]
    assert [im.get_clim() for im in images] == [(0.0, pytest.approx(top_with_choice))] * 2
    assert images[0].get_array()[0, 0] == 1.0  # the forced weight is drawn (in the top colour), not dropped
    assert images[-1].colorbar.extend == "max"  # and the colorbar says that values lie above the scale


def test_plot_heads_colour_scale_tops_at_vmax_or_the_largest_weight():
    w = torch.eye(3).expand(2, 3, 3)  # every row forced onto one key: the scale falls back to the largest weight
    image = [ax for ax in plot_heads(w).axes if ax.images][-1].images[0]
    assert image.get_clim() == (0.0, 1.0) and image.colorbar.extend == "neither"
    image = [ax for ax in plot_heads(w * 0.25, vmax=0.5).axes if ax.images][-1].images[0]
    assert image.get_clim() == (0.0, 0.5)
    image = [ax for ax in plot_heads(torch.zeros(1, 2, 2)).axes if ax.images][0].images[0]
    assert image.get_clim() == (0.0, 1.0)  # all weights 0 (every key blocked): still a valid scale
    for bad in (0, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="vmax must be a positive finite number"):
            plot_heads(w, vmax=bad)


def test_plot_heads_wraps_heads_into_rows_and_takes_tensors_that_need_grad():
    m = mha.MultiHeadAttention(24, 6)
    _, w = m(torch.randn(1, 4, 24))
    assert w.requires_grad
    fig = plot_heads(w[0], list("abcd"), ncols=4)
    assert len([ax for ax in fig.axes if ax.images]) == 6  # 2 rows, empty slots removed


def test_plot_mask_draws_the_mask_as_0_and_1_with_its_labels():
    fig = plot_mask(mha.causal_mask(2, 5).int(), ["q0", "q1"], key_tokens=list("abcde"))
    (ax,) = fig.axes
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert ax.images[0].get_array().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")


def test_plot_heads_and_plot_mask_refuse_wrong_labels_shapes_and_values():
    with pytest.raises(ValueError, match="has 2 labels but T = 3"):
        plot_heads(torch.rand(1, 3, 3), ["a", "b"])
    with pytest.raises(ValueError, match=r"\(h, T, S\)"):
        plot_heads(torch.rand(3, 3))
    with pytest.raises(ValueError, match="0 and 1"):
        plot_mask(torch.full((2, 2), 0.5))


def test_plot_heads_refuses_a_bad_batch_index_ncols_or_head_names():
    w = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match="batch_index=5"):
        plot_heads(w, batch_index=5)
    with pytest.raises(ValueError, match="ncols"):
        plot_heads(w[0], ncols=0)
    with pytest.raises(ValueError, match="head_names has 1 labels but h = 3"):
        plot_heads(w[0], head_names=["a"])


def test_plot_heads_refuses_a_string_of_tokens_and_nan_weights_naming_where():
    # The fault: "abcd" passed as 4 labels (head_view refuses it), and NaN weights were drawn as empty cells.
    w = torch.softmax(torch.randn(2, 4, 4), -1)
    for kwargs in ({"tokens": "abcd"}, {"tokens": list("abcd"), "key_tokens": "wxyz"}):
        with pytest.raises(TypeError, match=r"tokens must be a list of strings, got one string '(abcd|wxyz)': use"):
            plot_heads(w, **kwargs)
    with pytest.raises(TypeError, match=r"tokens must be a list of strings, got one string"):
        plot_mask(mha.causal_mask(4), "abcd")
    w[1, 2, 3] = w[1, 3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"weights contain NaN \(2 of 32\), the first at head 1, query 2, key 3"):
        plot_heads(w[None], list("abcd"))


def test_notebook_style_undoes_a_local_matplotlibrc():
    from mha.plot import notebook_style

    with matplotlib.rc_context({"figure.dpi": 72, "figure.figsize": (3.0, 2.0), "font.size": 7.0}):
        notebook_style()
        assert plt.rcParams["figure.dpi"] == matplotlib.rcParamsDefault["figure.dpi"] == 100
        assert list(plt.rcParams["figure.figsize"]) == list(matplotlib.rcParamsDefault["figure.figsize"])
        # Text 1.2 times matplotlib's default, so that it reads on the website, where figures are scaled
        # to the text column; titles and ticks follow it.
        assert plt.rcParams["font.size"] == 1.2 * matplotlib.rcParamsDefault["font.size"] == 12
        fig = plot_heads(torch.softmax(torch.randn(4, 5, 5), -1), list("abcde"))
        heat = [ax for ax in fig.axes if ax.images]
        assert heat[0].title.get_fontsize() == 12
        assert heat[0].get_yticklabels()[0].get_fontsize() == pytest.approx(10, abs=0.01)  # "small": 12 / 1.2


def test_plot_heads_keeps_four_heads_within_a_page_width():
    w = torch.softmax(torch.randn(8, 5, 5), -1)
    assert plot_heads(w[:4]).get_size_inches()[0] <= 8.8  # 4 in a row
    assert plot_heads(w[:1]).get_size_inches()[0] == pytest.approx(2.6 + 0.8)  # one head keeps its size
    assert plot_heads(w[:4], size=3.0).get_size_inches()[0] == pytest.approx(4 * 3.0 + 0.8)  # as asked
