"""The library contract of issue 2 and the article's claims."""

import inspect

import pytest
import torch
from helpers import assert_close
from torch import nn

import mha


def test_the_articles_example_gives_y_and_per_head_weights():
    y, w = mha.MultiHeadAttention(d_model=32, h=4)(torch.randn(2, 6, 32))
    assert y.shape == (2, 6, 32)
    assert w.shape == (2, 4, 6, 6)


def test_layer_holds_one_fused_qkv_linear_and_one_output_linear():
    m = mha.MultiHeadAttention(32, 4)
    assert (m.h, m.d_k) == (4, 8)
    assert isinstance(m.qkv, nn.Linear) and m.qkv.weight.shape == (96, 32)
    assert isinstance(m.out, nn.Linear) and m.out.weight.shape == (32, 32)


def test_signatures_are_the_published_ones():
    sdpa = inspect.signature(mha.scaled_dot_product_attention).parameters
    assert list(sdpa)[:4] == ["q", "k", "v", "mask"]
    assert {n: sdpa[n].default for n in ("is_causal", "scale", "dropout_p")} == {
        "is_causal": False, "scale": None, "dropout_p": 0.0,
    }
    fwd = inspect.signature(mha.MultiHeadAttention.forward).parameters
    assert list(fwd)[:3] == ["self", "x", "context"]
    assert {n: fwd[n].default for n in ("causal", "mask", "need_weights")} == {
        "causal": None, "mask": None, "need_weights": True,
    }
    # A shard of the layer (mha.parallel) is called as the layer is.
    from mha.parallel.sharding import ShardedMultiHeadAttention

    shard = inspect.signature(ShardedMultiHeadAttention.forward).parameters
    assert [(n, p.kind, p.default) for n, p in shard.items()] == [(n, p.kind, p.default) for n, p in fwd.items()]


def test_causal_defaults_to_self_attention_only_and_refuses_an_explicit_true_with_a_context():
    # The fault: causal=True with a context was silently dropped (cross-attention is never causal).
    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64)
    x, context = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    assert torch.equal(m(x)[1], m(x, causal=True)[1])  # self-attention: causal by default
    assert m(x)[1][0, 0, 0, 1:].abs().max() == 0 and m(x, causal=False)[1][0, 0, 0, 1:].min() > 0
    for fused in (False, True):  # cross-attention: not causal by default, nor with causal=False
        y, _ = m(x, context, need_weights=not fused)
        assert_close(y, m(x, context, causal=False, need_weights=not fused)[0])
        assert_close(y, mha.to_torch(m)(x, context, context)[0])  # every query sees all 5 keys
    with pytest.raises(ValueError, match=r"causal=True with a context: x and context are different sequences.*"
                                         r"pass a mask to restrict it"):
        m(x, context, causal=True)


@pytest.mark.parametrize("h", [1, 4])
def test_parameter_count_does_not_depend_on_heads(h):
    assert mha.count_parameters(mha.MultiHeadAttention(32, h)) == (4096, 128, 4224)


@pytest.mark.parametrize("h", [1, 2, 4, 8, 16, 32])
def test_parameter_count_is_4_d_model_squared_plus_4_d_model_for_any_h(h):
    d = 32
    c = mha.count_parameters(mha.MultiHeadAttention(d, h))
    assert c.weights == 4 * d * d and c.biases == 4 * d and c.total == 4 * d * d + 4 * d


def test_gpt2_small_attention_parameters():
    c = mha.count_parameters(mha.MultiHeadAttention(768, 12))
    assert (c.weights, c.biases, c.total) == (2_359_296, 3_072, 2_362_368)


def test_parameter_count_matches_nn_multiheadattention():
    assert mha.count_parameters(nn.MultiheadAttention(768, 12)) == mha.count_parameters(
        mha.MultiHeadAttention(768, 12)
    )


def test_rows_sum_to_one_without_dropout():
    q, k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 7, 4), torch.randn(3, 2, 7, 6)
    out, w = mha.scaled_dot_product_attention(q, k, v)
    assert out.shape == (3, 2, 5, 6) and w.shape == (3, 2, 5, 7)
    assert_close(w.sum(-1), torch.ones(3, 2, 5))


def test_default_scale_is_inverse_sqrt_dk():
    q, k, v = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 4, 16, dtype=torch.float64), torch.randn(
        2, 4, 5, dtype=torch.float64
    )
    _, w_default = mha.scaled_dot_product_attention(q, k, v)
    _, w_explicit = mha.scaled_dot_product_attention(q, k, v, scale=0.25)
    assert_close(w_default, w_explicit, atol=1e-15)
    assert_close(w_default, torch.softmax(q @ k.mT / 4, -1), atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.uint8, torch.float32, torch.float64])
def test_all_mask_dtypes_mean_the_same(dtype):
    q = k = v = torch.randn(1, 4, 8)
    keep = torch.tril(torch.ones(4, 4))
    expected, _ = mha.scaled_dot_product_attention(q, k, v, keep.bool())
    out, _ = mha.scaled_dot_product_attention(q, k, v, keep.to(dtype))
    assert torch.equal(out, expected)


def test_causal_combines_with_mask():
    q = k = v = torch.randn(1, 5, 4)
    keep = torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool)  # key 2 is blocked for every query
    _, w = mha.scaled_dot_product_attention(q, k, v, keep, is_causal=True)
    allowed = mha.causal_mask(5) & keep
    assert torch.equal(w[0] > 0, allowed)


def test_padding_mask_from_lengths():
    assert mha.padding_mask([3, 1]).tolist() == [[True, True, True], [True, False, False]]
    assert mha.padding_mask(torch.tensor([2, 0]), 4).tolist() == [[True, True, False, False], [False] * 4]


def test_half_precision_stays_finite():
    q = torch.full((1, 2, 64), 60.0)  # logits 64 * 60 * 60 / 8 = 28800; q·k unscaled is 230400 > 65504
    for dtype in (torch.float16, torch.bfloat16):
        for need_weights in (True, False):
            out, w = mha.scaled_dot_product_attention(
                q.to(dtype), q.to(dtype), torch.randn(1, 2, 64).to(dtype), need_weights=need_weights
            )
            assert out.dtype == dtype and torch.isfinite(out).all()
            if need_weights:
                assert w.dtype == dtype and torch.isfinite(w).all()


def test_half_precision_scores_above_float16_range():
    # Scaled scores themselves above 65504: the softmax must still run in float32.
    q = torch.full((1, 3, 4), 200.0, dtype=torch.float16)
    k = torch.tensor([[[200.0] * 4, [-200.0] * 4, [199.0] * 4]], dtype=torch.float16)
    out, w = mha.scaled_dot_product_attention(q, k, torch.eye(3, 4, dtype=torch.float16)[None], scale=1.0)
    assert torch.isfinite(w).all() and torch.isfinite(out).all()
    assert w[0, 0].argmax() == 0


def test_dropout_only_where_asked():
    q = k = v = torch.randn(2, 8, 8)
    a, _ = mha.scaled_dot_product_attention(q, k, v)
    b, _ = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(a, b)
    _, w = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert (w == 0).any()


def test_masks_are_used_on_the_inputs_device():
    q = torch.randn(1, 3, 4, device="meta")
    out, w = mha.scaled_dot_product_attention(q, q, q, torch.ones(3, 3, dtype=torch.bool), is_causal=True)
    assert out.device.type == "meta" and w.device.type == "meta"


def test_half_precision_survives_autocast():
    # Autocast would cast the float32 score matmul back to float16; the explicit path turns it off.
    q = torch.full((1, 1, 2, 4), 200.0)
    m = mha.MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8) * 300
    with torch.autocast("cpu", dtype=torch.float16):
        for need_weights in (True, False):
            assert torch.isfinite(mha.scaled_dot_product_attention(q, q, q, need_weights=need_weights)[0]).all()
            assert torch.isfinite(m(x, need_weights=need_weights)[0]).all()


def test_empty_batches_and_sequences_give_empty_finite_outputs():
    m = mha.MultiHeadAttention(8, 2)
    assert m(torch.randn(0, 3, 8))[0].shape == (0, 3, 8)
    assert m(torch.randn(2, 0, 8))[1].shape == (2, 2, 0, 0)
    y, w = m(torch.randn(2, 3, 8), torch.randn(2, 0, 8))
    assert w.shape == (2, 2, 3, 0) and torch.isfinite(y).all()


def test_padding_mask_builds_on_the_requested_device():
    assert mha.padding_mask([2, 3], device="meta").device.type == "meta"
    assert mha.padding_mask([]).shape == (0, 0)
