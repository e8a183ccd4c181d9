"""A layer made of chosen heads: MultiHeadAttention(d_k=...) and MultiHeadAttention.from_heads (issue 18)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

import mha


def layer(h=4, n_kv_heads=None, bias=True, **kwargs):
    return mha.MultiHeadAttention(16, h, n_kv_heads=n_kv_heads, bias=bias, dtype=torch.float64, **kwargs).eval()


def reference(m, x, keep=None):
    """y and weights computed from m's weights by F.scaled_dot_product_attention and plain matmuls."""
    d_k, h, g = m.d_k, m.h, m.n_kv_heads
    W_Q, W_K, W_V = m.qkv.weight.split([h * d_k, g * d_k, g * d_k])
    b_Q, b_K, b_V = (None,) * 3 if m.qkv.bias is None else m.qkv.bias.split([h * d_k, g * d_k, g * d_k])
    q = F.linear(x, W_Q, b_Q).unflatten(-1, (h, d_k)).transpose(1, 2)  # (B, h, T, d_k)
    k, v = (F.linear(x, W, b).unflatten(-1, (g, d_k)).transpose(1, 2).repeat_interleave(h // g, 1)
            for W, b in ((W_K, b_K), (W_V, b_V)))
    keep = mha.causal_mask(x.size(1)) if keep is None else keep
    scores = (q @ k.mT / d_k**0.5).masked_fill(~keep, float("-inf"))
    w = scores.softmax(-1)
    return m.out((w @ v).transpose(1, 2).flatten(2)), w


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("d_k", [None, 3, 8])
def test_explicit_d_k_sets_the_inner_width(n_kv_heads, d_k):
    m = layer(n_kv_heads=n_kv_heads, d_k=d_k)
    d, g = d_k or 4, n_kv_heads or 4
    assert m.d_k == d and m.qkv.weight.shape == ((4 + 2 * g) * d, 16) and m.out.weight.shape == (16, 4 * d)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    y_ref, w_ref = reference(m, x)
    for need_weights in (True, False):
        y, w = m(x, need_weights=need_weights)
        assert_close(y, y_ref)
        if need_weights:
            assert_close(w, w_ref)


def test_default_d_k_keeps_the_divisibility_check():
    with pytest.raises(ValueError, match=r"d_model=512 is not divisible by h=6"):
        mha.MultiHeadAttention(512, 6)
    assert mha.MultiHeadAttention(512, 6, d_k=64).out.weight.shape == (512, 384)  # explicit: no divisibility asked
    for bad, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="d_k must be"):
            mha.MultiHeadAttention(16, 4, d_k=bad)


def test_to_torch_refuses_heads_that_do_not_split_d_model():
    with pytest.raises(ValueError, match=r"h=4 heads of d_k=3 make 12, not d_model=16"):
        mha.to_torch(layer(d_k=3))
    m = layer(d_k=4)  # explicit, but the default width: nn.MultiheadAttention can hold it
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    assert_close(mha.to_torch(m)(x, x, x, attn_mask=mha.to_torch_attn_mask(mha.causal_mask(3)))[0], m(x)[0])


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_a_layer_of_all_heads_equals_the_original(n_kv_heads, bias):
    m = layer(n_kv_heads=n_kv_heads, bias=bias)
    copy = mha.MultiHeadAttention.from_heads(m, range(4))
    for (name, a), (_, b) in zip(m.state_dict().items(), copy.state_dict().items()):
        assert torch.equal(a, b), name
    x, context = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    keep = mha.padding_mask([7, 4])[:, None, None, :]
    for args, kwargs in (((x,), {}), ((x, context), {"mask": keep}), ((x,), {"need_weights": False})):
        y, w = m(*args, **kwargs)
        y_copy, w_copy = copy(*args, **kwargs)
        assert_close(y_copy, y, atol=1e-12)
        if w is not None:
            assert_close(w_copy, w, atol=1e-12)


PARTITIONS = [  # (h, n_kv_heads, partition of the query heads)
    (4, None, [range(0, 2), range(2, 4)]),
    (4, None, [[3], [0, 2], [1]]),  # any order, any sizes: one K/V head per query head
    (4, 2, [range(0, 2), range(2, 4)]),
    (4, 2, [[0], [1], [2], [3]]),  # one query head and its K/V head each
    (8, 2, [[4, 5, 6, 7], [1, 0, 2, 3]]),  # within a K/V head's group, any order
    (4, 2, [[0, 2], [1, 3]]),  # heads of two K/V heads, one each: both K/V heads are copied into both
    (4, 1, [[0, 1], [2, 3]]),  # multi-query: the one K/V head goes to every part
]


@pytest.mark.parametrize("h, n_kv_heads, parts", PARTITIONS)
@pytest.mark.parametrize("need_weights", [True, False])
def test_partial_outputs_sum_to_the_full_layer(h, n_kv_heads, parts, need_weights):
    m = layer(h=h, n_kv_heads=n_kv_heads)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    keep = mha.padding_mask([6, 3])[:, None, None, :]
    y, w = m(x, mask=keep, need_weights=need_weights)
    total = m.out.bias.clone()
    for heads in parts:
        part = mha.MultiHeadAttention.from_heads(m, heads, out_bias=False)
        assert part.out.bias is None and part.h == len(heads)
        y_part, w_part = part(x, mask=keep, need_weights=need_weights)
        total = total + y_part
        if need_weights:  # its head i is the layer's head heads[i]
            assert_close(w_part, w[:, list(heads)], atol=1e-12)
    assert_close(total, y, atol=1e-12)


def test_from_heads_keeps_dtype_dropout_training_and_frozen_parameters():
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=2, dropout=0.25, dtype=torch.float64).train()
    m.qkv.weight.requires_grad_(False)
    state = torch.get_rng_state()
    part = mha.MultiHeadAttention.from_heads(m, range(2, 4))
    assert torch.equal(torch.get_rng_state(), state)  # making it draws no random numbers
    assert (part.h, part.n_kv_heads, part.d_k, part.d_model, part.dropout) == (2, 1, 4, 16, 0.25)
    assert part.training and part.qkv.weight.dtype == torch.float64 and part.qkv.weight.device == m.qkv.weight.device
    assert [p.requires_grad for p in part.parameters()] == [False, True, True, True]
    assert torch.equal(part.out.bias, m.out.bias) and part.out.bias.data_ptr() != m.out.bias.data_ptr()  # a copy
    assert torch.equal(part.out.weight, m.out.weight[:, 8:])
    meta = mha.MultiHeadAttention.from_heads(mha.MultiHeadAttention(64, 8, device="meta"), [0])
    assert meta.qkv.weight.device.type == "meta" and meta.qkv.weight.shape == (24, 64)


@pytest.mark.parametrize("heads, error, message", [
    ([], ValueError, r"at least one head"),
    ([0, 0], ValueError, r"distinct indices in \[0, h=4\), got \[0, 0\]"),
    ([4], ValueError, r"distinct indices in \[0, h=4\), got \[4\]"),
    ([-1], ValueError, r"got \[-1\]"),
    ([0.0], TypeError, r"head indices must be ints, got 0.0"),
    ([0, 1, 2], ValueError, r"heads \[0, 1, 2\] use K/V heads \[0, 0, 1\]"),  # half of K/V head 1's heads
    ([0, 2, 1, 3], ValueError, r"use K/V heads \[0, 1, 0, 1\]"),  # each K/V head's heads apart
])
def test_from_heads_refuses_heads_that_make_no_layer(heads, error, message):
    with pytest.raises(error, match=message):
        mha.MultiHeadAttention.from_heads(layer(n_kv_heads=2), heads)


def test_from_heads_needs_our_layer():
    with pytest.raises(TypeError, match=r"from_heads needs an mha.MultiHeadAttention, got MultiheadAttention"):
        mha.MultiHeadAttention.from_heads(torch.nn.MultiheadAttention(16, 4), [0])


@pytest.mark.parametrize("n_kv_heads, heads, config", [(None, [2, 0], [2, 2, 4]), (2, range(2), [2, 1, 4])])
def test_a_layer_of_some_heads_saves_its_own_head_counts(n_kv_heads, heads, config):
    # from_heads builds on the meta device, then to_empty(): its saved head counts are its own (cases C19, C22).
    part = mha.MultiHeadAttention.from_heads(layer(n_kv_heads=n_kv_heads), heads)
    assert part.state_dict()["_extra_state"].tolist() == config == [part.h, part.n_kv_heads, part.d_k]
    with pytest.raises(ValueError, match=r"this state_dict is from a layer with h=2"):
        layer(n_kv_heads=n_kv_heads).load_state_dict(part.state_dict(), strict=False)
    mha.MultiHeadAttention(16, 2, n_kv_heads=config[1], d_k=4, dtype=torch.float64).load_state_dict(part.state_dict())
