"""Grouped-query attention and the KV cache (issue 5)."""

import pytest
import torch

import mha


def test_llama2_70b_attention_parameters():
    # d_model 8192, 64 query heads, 8 KV heads, no biases (Touvron et al. 2023).
    m = mha.MultiHeadAttention(8192, 64, n_kv_heads=8, bias=False, device="meta")
    assert mha.count_parameters(m) == (150_994_944, 0, 150_994_944)


@pytest.mark.parametrize("g", [1, 2, 4])
def test_gqa_layout(g):
    m = mha.MultiHeadAttention(32, 4, n_kv_heads=g)
    assert m.qkv.weight.shape == (32 + 2 * g * 8, 32)
    y, w = m(torch.randn(2, 5, 32))
    assert y.shape == (2, 5, 32) and w.shape == (2, 4, 5, 5)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_decoding_equals_one_causal_call(n_kv_heads, need_weights, chunk):
    m = mha.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, 10, 32)
    full, w_full = m(x)
    cache = mha.KVCache()
    parts = []
    for i in range(0, 10, chunk):
        y, w = m(x[:, i : i + chunk], cache=cache, need_weights=need_weights)
        parts.append(y)
        if need_weights:  # the new rows of the weights table, against every cached key
            torch.testing.assert_close(w, w_full[:, :, i : i + chunk, : i + chunk], rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    assert len(cache) == 10


def test_cache_memory():
    B, S, d_model, h = 2, 7, 64, 8
    for g in (8, 2, 1):
        cache = mha.KVCache()
        mha.MultiHeadAttention(d_model, h, n_kv_heads=g)(torch.randn(B, S, d_model), cache=cache)
        assert cache.nbytes == 2 * B * g * S * (d_model // h) * 4  # K and V, float32
        assert cache.k.shape == (B, g, S, d_model // h)
    cache.reset()
    assert len(cache) == 0 and cache.nbytes == 0


def test_cache_with_padding_mask_over_all_positions():
    m = mha.MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 6, 16)
    keep = mha.padding_mask([6, 4], 6)[:, None, None, :]
    full, _ = m(x, mask=keep)
    cache = mha.KVCache()
    steps = [m(x[:, t : t + 1], cache=cache, mask=keep[..., : t + 1])[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
