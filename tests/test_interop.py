"""Weights and masks to and from torch.nn.MultiheadAttention."""

import pytest
import torch
from helpers import assert_close
from torch import nn

import mha


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_copies_exactly(batch_first, bias):
    ref = nn.MultiheadAttention(12, 3, bias=bias, dropout=0.25, batch_first=batch_first).double().eval()
    m = mha.from_torch(ref)
    assert (m.h, m.d_k, m.dropout, m.training) == (3, 4, 0.25, False)
    assert (m.qkv.bias is None) == (not bias)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    xs = x if batch_first else x.transpose(0, 1)
    y_ref, w_ref = ref(xs, xs, xs, average_attn_weights=False)
    y_ref = y_ref if batch_first else y_ref.transpose(0, 1)
    y, w = m(x, causal=False)
    assert_close(y, y_ref, atol=1e-12)
    assert_close(w, w_ref, atol=1e-12)


def test_to_torch_is_batch_first_and_keeps_dropout():
    ref = mha.to_torch(mha.MultiHeadAttention(8, 2, dropout=0.1).eval())
    assert ref.batch_first and ref.dropout == 0.1 and not ref.training


def test_to_torch_attn_mask_inverts_keep_masks_and_repeats_them_per_head():
    keep = mha.causal_mask(3)
    assert torch.equal(mha.to_torch_attn_mask(keep), ~keep)
    assert torch.equal(mha.to_torch_attn_mask(keep.float()), ~keep)  # float 0/1 too
    pad = mha.padding_mask([3, 1], 3)[:, None, None, :]  # (B, 1, 1, S)
    converted = mha.to_torch_attn_mask(pad, shape=(2, 4, 3, 3))
    assert converted.shape == (8, 3, 3)
    assert torch.equal(converted[4:], ~pad[1, 0].expand(4, 3, 3))


def test_additive_mask_means_the_same_in_pytorch_sdpa():
    q, k, v = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)
    keep = torch.rand(4, 5) > 0.4
    keep[:, 0] = True
    additive = mha.to_additive_mask(keep, dtype=q.dtype)
    assert set(additive.unique().tolist()) <= {0.0, float("-inf")}
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    out, _ = mha.scaled_dot_product_attention(q, k, v, keep)
    assert_close(out, expected, atol=1e-6)


def test_frozen_parameters_stay_frozen():
    ref = nn.MultiheadAttention(8, 2)
    ref.in_proj_weight.requires_grad_(False)
    m = mha.from_torch(ref)
    assert not m.qkv.weight.requires_grad and m.out.weight.requires_grad
    assert [p.requires_grad for p in mha.to_torch(m).parameters()] == [False, True, True, True]


def test_bias_kv_counts_as_bias():
    assert mha.count_parameters(nn.MultiheadAttention(8, 2, add_bias_kv=True)).biases == 3 * 8 + 8 + 2 * 8
