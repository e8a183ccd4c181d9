"""torch.autograd.gradcheck in float64, including masks with fully blocked rows."""

import pytest
import torch
from torch.autograd import gradcheck

import mha

# Row 1 blocks every key: its weights and output are zero, and its gradients too.
KEEP = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)


@pytest.mark.slow
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("mask, is_causal", [(None, False), (None, True), (KEEP, False), (KEEP, True)])
def test_function_gradients_match_finite_differences_with_blocked_rows(mask, is_causal, need_weights):
    q = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)

    def f(q, k, v):
        out, w = mha.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, need_weights=need_weights)
        return out if w is None else (out, w)

    assert gradcheck(f, (q, k, v))


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_layer_gradients_match_finite_differences_and_stay_finite_on_padding(need_weights, n_kv_heads):
    m = mha.MultiHeadAttention(8, 2, n_kv_heads=n_kv_heads).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    keep = mha.padding_mask([3, 0], 4)[:, None, None, :]  # sample 1 is all padding

    def f(x):
        return m(x, mask=keep, need_weights=need_weights)[0]

    assert gradcheck(f, (x,))
    x.grad = None
    f(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_cross_attention_gradients_match_finite_differences():
    m = mha.MultiHeadAttention(6, 3).double()
    x = torch.randn(1, 2, 6, dtype=torch.float64, requires_grad=True)
    c = torch.randn(1, 5, 6, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, c: m(x, c)[0], (x, c))
