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


def test_plot_heads_structure():
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


def test_plot_heads_grid_and_grad_tensors():
    m = mha.MultiHeadAttention(24, 6)
    _, w = m(torch.randn(1, 4, 24))
    assert w.requires_grad
    fig = plot_heads(w[0], list("abcd"), ncols=4)
    assert len([ax for ax in fig.axes if ax.images]) == 6  # 2 rows, empty slots removed


def test_plot_mask_structure():
    fig = plot_mask(mha.causal_mask(2, 5).int(), ["q0", "q1"], key_tokens=list("abcde"))
    (ax,) = fig.axes
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert ax.images[0].get_array().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")


def test_plot_errors():
    with pytest.raises(ValueError, match="has 2 labels but T = 3"):
        plot_heads(torch.rand(1, 3, 3), ["a", "b"])
    with pytest.raises(ValueError, match=r"\(h, T, S\)"):
        plot_heads(torch.rand(3, 3))
    with pytest.raises(ValueError, match="0 and 1"):
        plot_mask(torch.full((2, 2), 0.5))


def test_plot_argument_errors():
    w = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match="batch_index=5"):
        plot_heads(w, batch_index=5)
    with pytest.raises(ValueError, match="ncols"):
        plot_heads(w[0], ncols=0)
    with pytest.raises(ValueError, match="head_names has 1 labels but h = 3"):
        plot_heads(w[0], head_names=["a"])
