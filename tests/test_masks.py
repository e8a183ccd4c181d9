"""Keep-masks (mha/masks.py): True or 1 = this query may attend to this key, checked and never reinterpreted.

The reference for a mask's meaning is ``F.scaled_dot_product_attention``, which reads a bool mask the same way;
causal and padding masks are checked against their definitions, written here with index comparisons.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st

import mha

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.c2
def test_a_float_01_mask_blocks_what_its_zeros_say():
    """C2: a float tril(ones) mask, the previous post's style, blocked nothing (PyTorch adds float masks)."""
    m = mha.MultiHeadAttention(8, 2)
    tril = torch.tril(torch.ones(4, 4))
    x = torch.randn(1, 4, 8)
    later = x.clone()
    later[:, 3] = torch.randn(8)  # only token 3 changes
    for need_weights in (True, False):
        y = m(x, mask=tril, causal=False, need_weights=need_weights)[0]
        assert torch.equal(y[:, 0], m(later, mask=tril, causal=False, need_weights=need_weights)[0][:, 0])
    q, k, v = (torch.randn(2, 4, 3, dtype=torch.float64) for _ in range(3))
    out, _ = mha.scaled_dot_product_attention(q, k, v, tril.double())
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=tril.bool()))
    assert torch.equal(mha.as_keep_mask(torch.tensor([[0, 1], [1, 1]])), torch.tensor([[False, True], [True, True]]))


@pytest.mark.c2
@pytest.mark.parametrize("mask, message", [
    (torch.zeros(4, 4).masked_fill(~torch.ones(4, 4).tril().bool(), float("-inf")),
     r"values other than 0 and 1.*additive mask.*keep = \(additive_mask == 0\)"),
    (torch.ones(4, 4).tril() * 0.5, r"torch.float32 mask holds values other than 0 and 1 \(e.g. 0.5\)"),
    (torch.zeros(4, 4), r"is all zeros, which as a keep-mask blocks every key.*pass mask=None"),
], ids=["additive", "0.5", "all zeros"])
def test_a_float_mask_that_is_not_a_keep_mask_is_refused_naming_the_convention(mask, message):
    """C2: an additive float mask (0 and -inf) must raise a ValueError that explains the convention, never be
    reinterpreted; an all-zeros float mask is an additive mask that blocks nothing, refused likewise."""
    with pytest.raises(ValueError, match=message) as refused:
        mha.as_keep_mask(mask)
    assert mha.masks.CONVENTION in str(refused.value)


def test_an_all_false_bool_mask_is_unambiguous_and_blocks_every_key():
    keep = torch.zeros(3, 3, dtype=torch.bool)
    assert torch.equal(mha.as_keep_mask(keep), keep)
    out, w = mha.scaled_dot_product_attention(*(torch.randn(1, 3, 4),) * 3, keep)
    assert torch.equal(out, torch.zeros(1, 3, 4)) and torch.equal(w, torch.zeros(1, 3, 3))


@pytest.mark.c5
@given(st.integers(0, 7), st.integers(0, 7))
def test_causal_mask_is_aligned_bottom_right(T, S):
    """C5: PyTorch aligns causal masks top-left, so one new token against five cached keys saw only key 0."""
    i, j = torch.arange(T)[:, None], torch.arange(S)[None, :]
    assert torch.equal(mha.causal_mask(T, S), j <= i + (S - T))  # the last T of S positions are the queries
    if T == S:
        assert torch.equal(mha.causal_mask(T), torch.ones(T, T).tril().bool())


@pytest.mark.c5
def test_causal_mask_for_two_new_tokens_against_five_keys():
    """C5: for 2 queries and 5 keys the allowed pattern is [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]."""
    assert mha.causal_mask(2, 5).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("lengths", [[3, 1, 0], torch.tensor([3, 1, 0])], ids=["list", "tensor"])
def test_padding_mask_keeps_each_sequences_real_tokens(lengths):
    assert mha.padding_mask(lengths, 4).int().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert mha.padding_mask(lengths).shape == (3, 3)  # S defaults to the longest


def test_numpy_integers_are_sizes_as_for_pytorch():
    """NumPy integers (from an array's shape or a lengths array) were refused as "must be an int", where torch.ones
    and nn.Linear take them."""
    np = pytest.importorskip("numpy")
    assert torch.equal(mha.causal_mask(np.int64(3), np.int64(5)), mha.causal_mask(3, 5))
    assert torch.equal(mha.padding_mask(np.array([3, 1])), mha.padding_mask([3, 1]))
    m = mha.MultiHeadAttention(np.int64(16), np.int64(4))
    assert (m.d_model, m.h, m.d_k) == (16, 4, 4) and type(m.h) is int
