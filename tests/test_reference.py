"""Agreement with torch.nn.MultiheadAttention and F.scaled_dot_product_attention on fixed configurations."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, sdpa_reference, torch_reference

import mha

CONFIGS = [  # d_model, h, B, T, S (None = self-attention)
    (32, 4, 2, 6, None),
    (32, 1, 1, 5, None),
    (12, 12, 3, 4, None),
    (24, 3, 2, 7, 4),
    (16, 2, 1, 1, 9),
    (64, 8, 2, 16, None),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d_model, h, B, T, S", CONFIGS)
@pytest.mark.parametrize("bias", [True, False])
def test_module_matches_torch(d_model, h, B, T, S, bias, dtype):
    m = mha.MultiHeadAttention(d_model, h, bias=bias).to(dtype)
    x = torch.randn(B, T, d_model, dtype=dtype)
    context = None if S is None else torch.randn(B, S, d_model, dtype=dtype)
    keep = mha.causal_mask(T) if context is None else None
    y, w = m(x, context)
    y_ref, w_ref = torch_reference(m, x, context, keep)
    assert_close(y, y_ref)
    assert_close(w, w_ref)
    assert_close(y, sdpa_reference(m, x, context, keep))
    y_fused, none = m(x, context, need_weights=False)
    assert none is None
    assert_close(y_fused, y_ref)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape_q, shape_k", [((2, 3, 5, 8), (2, 3, 7, 8)), ((4, 6, 8), (4, 6, 8)), ((3, 4), (5, 4))])
@pytest.mark.parametrize("is_causal", [False, True])
def test_function_matches_torch_sdpa(shape_q, shape_k, is_causal, dtype):
    q, k, v = torch.randn(shape_q, dtype=dtype), torch.randn(shape_k, dtype=dtype), torch.randn(shape_k, dtype=dtype)
    T, S = q.size(-2), k.size(-2)
    # PyTorch's is_causal aligns top-left; ours bottom-right. Pass the mask explicitly to compare meaning.
    keep = mha.causal_mask(T, S) if is_causal else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    out, w = mha.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert_close(out, expected)
    fused, _ = mha.scaled_dot_product_attention(q, k, v, is_causal=is_causal, need_weights=False)
    assert_close(fused, expected)


def test_grouped_query_attention_agrees_on_the_fused_and_explicit_paths_and_with_repeated_heads():
    q, k, v = torch.randn(2, 6, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 3)
    keep = torch.rand(2, 6, 5, 7) > 0.3
    native, _ = mha.scaled_dot_product_attention(q, k, v, keep, enable_gqa=True, need_weights=False)
    explicit, _ = mha.scaled_dot_product_attention(q, k, v, keep, enable_gqa=True)
    repeated, _ = mha.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), keep
    )
    assert_close(native, repeated, atol=1e-6)
    assert_close(explicit, repeated, atol=1e-6)
    assert_close(native, explicit, atol=1e-5)
