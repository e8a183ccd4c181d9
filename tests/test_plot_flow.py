"""mha.plot.plot_data_flow draws the layer's real shapes, on a figure that reads on a phone."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import mha  # noqa: E402
from mha.plot import plot_data_flow  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def texts(fig):
    return " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))


@pytest.mark.parametrize("d_model, h, B, T", [(32, 4, 2, 6), (64, 8, 1, 5), (12, 1, 3, 7)])
def test_the_picture_names_the_shapes_the_layer_makes(d_model, h, B, T):
    layer = mha.MultiHeadAttention(d_model, h)
    x = torch.randn(B, T, d_model)
    y, w = layer(x)
    q, k, v = (mha.split_heads(t, h) for t in mha.project(layer, x))
    drawn = texts(plot_data_flow(d_model=d_model, h=h, B=B, T=T))
    for shape in (x.shape, layer.qkv(x)[..., :d_model].shape, q.shape, w.shape, y.shape):
        assert str(tuple(shape)) in drawn, (tuple(shape), drawn)
    assert f"Linear({d_model}, {3 * d_model})" in drawn and f"Linear({d_model}, {d_model})" in drawn
    assert all(f"h{i}" in drawn for i in range(h))  # each head named, not only coloured


def test_it_is_narrow_enough_for_a_phone():
    fig = plot_data_flow()
    width = fig.get_size_inches()[0]
    smallest = min(t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip())
    assert smallest >= 1.8 * width  # 9 px or more on a figure shown 358 px wide


def test_it_refuses_widths_the_heads_cannot_share_and_too_many_heads():
    with pytest.raises(ValueError, match=r"d_model=30 is not divisible by h=4"):
        plot_data_flow(d_model=30, h=4)
    with pytest.raises(ValueError, match=r"at most 8 heads side by side, got h=16"):
        plot_data_flow(d_model=64, h=16)
    with pytest.raises(TypeError, match=r"h must be an int, got float 4.0"):
        plot_data_flow(h=4.0)
    with pytest.raises(ValueError, match=r"T must be positive, got 0"):
        plot_data_flow(T=0)
