"""Grouped-query attention and the KV cache (issue 5)."""

import pytest
import torch
from helpers import assert_close

import mha

MODES = pytest.mark.parametrize("max_len", [None, 16], ids=["growing", "preallocated"])


def test_llama2_70b_attention_parameters():
    # d_model 8192, 64 query heads, 8 KV heads, no biases (Touvron et al. 2023).
    m = mha.MultiHeadAttention(8192, 64, n_kv_heads=8, bias=False, device="meta")
    assert mha.count_parameters(m) == (150_994_944, 0, 150_994_944)


@pytest.mark.parametrize("g", [1, 2, 4])
def test_fewer_kv_heads_shrink_the_qkv_projection_not_the_outputs(g):
    m = mha.MultiHeadAttention(32, 4, n_kv_heads=g)
    assert m.qkv.weight.shape == (32 + 2 * g * 8, 32)
    y, w = m(torch.randn(2, 5, 32))
    assert y.shape == (2, 5, 32) and w.shape == (2, 4, 5, 5)


@pytest.mark.parametrize("max_len", [None, 10, 16], ids=["growing", "preallocated-full", "preallocated"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_decoding_equals_one_causal_call(n_kv_heads, need_weights, chunk, max_len):
    m = mha.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, 10, 32)
    full, w_full = m(x)
    cache = mha.KVCache(max_len=max_len)
    parts = []
    for i in range(0, 10, chunk):
        y, w = m(x[:, i : i + chunk], cache=cache, need_weights=need_weights)
        parts.append(y)
        if need_weights:  # the new rows of the weights table, against every cached key
            assert_close(w, w_full[:, :, i : i + chunk, : i + chunk], atol=1e-5)
    assert_close(torch.cat(parts, dim=1), full, atol=1e-5)
    assert len(cache) == 10


@pytest.mark.parametrize("max_len", [None, 20])
def test_nbytes_counts_the_filled_positions_or_the_whole_buffers_and_reset_empties(max_len):
    B, S, d_model, h = 2, 7, 64, 8
    for g in (8, 2, 1):
        cache = mha.KVCache(max_len=max_len)
        assert cache.nbytes == 0
        mha.MultiHeadAttention(d_model, h, n_kv_heads=g)(torch.randn(B, S, d_model), cache=cache)
        # K and V, float32: the filled positions, or the whole preallocated buffers
        assert cache.nbytes == 2 * B * g * (max_len or S) * (d_model // h) * 4
        assert cache.k.shape == cache.v.shape == (B, g, S, d_model // h) and len(cache) == S
    cache.reset()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.k is None


def test_cache_with_padding_mask_over_all_positions():
    m = mha.MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 6, 16)
    keep = mha.padding_mask([6, 4], 6)[:, None, None, :]
    full, _ = m(x, mask=keep)
    cache = mha.KVCache()
    steps = [m(x[:, t : t + 1], cache=cache, mask=keep[..., : t + 1])[0] for t in range(6)]
    assert_close(torch.cat(steps, 1), full, atol=1e-5)


def test_preallocated_cache_writes_each_step_in_place():
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=2).eval()
    x = torch.randn(3, 9, 16)
    cache = mha.KVCache(max_len=12)
    m(x[:, :4], cache=cache)  # the first update allocates (B, g, max_len, d_k) for K and for V
    k_buffer, v_buffer = cache.k.untyped_storage(), cache.v.untyped_storage()
    assert k_buffer.nbytes() == v_buffer.nbytes() == 3 * 2 * 12 * 4 * 4
    first_k = cache.k.clone()
    for t in range(4, 9):
        m(x[:, t : t + 1], cache=cache)
        assert cache.k.untyped_storage().data_ptr() == k_buffer.data_ptr()  # never reallocated
        assert cache.v.untyped_storage().data_ptr() == v_buffer.data_ptr()
        assert cache.k.shape == (3, 2, t + 1, 4) and len(cache) == t + 1
    assert torch.equal(cache.k[:, :, :4], first_k)  # earlier positions are never rewritten
    # The same keys and values as a growing cache.
    grown = mha.KVCache()
    m(x, cache=grown)
    assert_close(cache.k, grown.k, atol=1e-6)
    assert_close(cache.v, grown.v, atol=1e-6)


def test_going_past_max_len_raises_naming_both_numbers_and_stores_nothing():
    m = mha.MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, 8, 16)
    cache = mha.KVCache(max_len=5)
    with pytest.raises(ValueError, match=r"make 8, past the cache's max_len=5"):
        m(x, cache=cache)  # already the first update
    assert cache.k is None and cache.nbytes == 0
    m(x[:, :4], cache=cache)
    k = cache.k.clone()
    with pytest.raises(ValueError, match=r"2 new positions after 4 cached would make 6, past the cache's max_len=5"):
        m(x[:, 4:6], cache=cache)
    assert len(cache) == 4 and torch.equal(cache.k, k)
    y, _ = m(x[:, 4:5], cache=cache)  # exactly max_len fits
    assert_close(y, m(x[:, :5])[0][:, 4:], atol=1e-6)
    with pytest.raises(ValueError, match=r"make 6, past the cache's max_len=5"):
        m(x[:, 5:6], cache=cache)
    cache.reset()  # frees the buffers; the next update allocates again, for any batch
    assert len(cache) == 0 and cache.nbytes == 0
    m(torch.randn(2, 5, 16), cache=cache)
    assert len(cache) == 5 and cache.nbytes == 2 * 2 * 4 * 5 * 4 * 4


@MODES
def test_a_cache_rejects_another_batch_dtype_or_device_and_keeps_what_it_had(max_len):
    m = mha.MultiHeadAttention(8, 2)
    cache = mha.KVCache(max_len=max_len)
    m(torch.randn(2, 3, 8), cache=cache)
    k = cache.k.clone()
    with pytest.raises(ValueError, match=r"don't fit the cache.*use a fresh KVCache for a new batch"):
        m(torch.randn(3, 1, 8), cache=cache)
    with pytest.raises(TypeError, match=r"torch.float64 on cpu but the cache holds torch.float32.*fresh KVCache"):
        m.double()(torch.randn(2, 1, 8, dtype=torch.float64), cache=cache)
    with pytest.raises(TypeError, match=r"on meta but the cache holds torch.float32 on cpu"):
        m.float().to("meta")(torch.randn(2, 1, 8, device="meta"), cache=cache)
    assert len(cache) == 3 and torch.equal(cache.k, k)


@MODES
def test_a_call_that_raises_leaves_the_cache_alone(max_len):
    m = mha.MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 5, 8)
    cache = mha.KVCache(max_len=max_len)
    m(x[:, :3], cache=cache)
    with pytest.raises(ValueError, match=r"\(1, 2, 1, 4\)"):
        m(x[:, 3:4], cache=cache, mask=torch.ones(1, 3))  # forgot the new token's column
    with pytest.raises(ValueError, match=r"values other than 0 and 1"):  # values, too, before the cache changes
        m(x[:, 3:4], cache=cache, mask=torch.tensor([1, 1, 1, 2]))
    assert len(cache) == 3
    y, w = m(x[:, 3:4], cache=cache)
    assert w.shape == (1, 2, 1, 4)
    assert_close(y, m(x[:, :4])[0][:, 3:], atol=1e-6)


@pytest.mark.parametrize("max_len, error, message", [
    (0, ValueError, r"max_len must be positive, got 0"),
    (-3, ValueError, r"max_len must be positive, got -3"),
    (2.5, TypeError, r"max_len must be an int, got 2.5"),
    (True, TypeError, r"max_len must be an int, got True"),
])
def test_max_len_must_be_a_positive_int(max_len, error, message):
    with pytest.raises(error, match=message):
        mha.KVCache(max_len=max_len)


def test_repr_shows_length_max_len_shape_and_bytes():
    m = mha.MultiHeadAttention(16, 4)
    grown, prealloc = mha.KVCache(), mha.KVCache(max_len=32)
    assert repr(grown) == "KVCache(len=0, k_shape=None, nbytes=0)"
    assert repr(prealloc) == "KVCache(len=0, max_len=32, k_shape=None, nbytes=0)"
    for cache in (grown, prealloc):
        m(torch.randn(1, 3, 16), cache=cache)
    assert repr(grown) == "KVCache(len=3, k_shape=(1, 4, 3, 4), nbytes=384)"  # 2 x 1*4*3*4 floats
    assert repr(prealloc) == "KVCache(len=3, max_len=32, k_shape=(1, 4, 3, 4), nbytes=4096)"  # 2 x 1*4*32*4 floats


# -- misuse of a cache (issue 17): each gets a clear error or the right answer, in both modes ------------------


@MODES
def test_a_cache_shared_by_two_layers_raises_and_stores_nothing(max_len):
    first, second = mha.MultiHeadAttention(16, 4).eval(), mha.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 3, 16)
    cache = mha.KVCache(max_len=max_len)
    first(x, cache=cache)
    k = cache.k.clone()
    with pytest.raises(ValueError, match=r"holds the keys of another layer, MultiHeadAttention\(d_model=16, h=4"):
        second(x[:, :1], cache=cache)  # same shapes: without the check it would silently append its keys
    assert len(cache) == 3 and torch.equal(cache.k, k)
    cache.reset()  # reset and reuse: the cache is free for any layer, and right
    y, _ = second(x, cache=cache)
    assert_close(y, second(x)[0], atol=1e-6)


@MODES
def test_reset_and_reuse_gives_a_fresh_cache(max_len):
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=2).eval()
    cache = mha.KVCache(max_len=max_len)
    m(torch.randn(2, 5, 16), cache=cache)
    cache.reset()
    assert len(cache) == 0 and cache.k is None and cache.nbytes == 0
    x = torch.randn(3, 6, 16)  # another batch, another length
    steps = [m(x[:, t : t + 1], cache=cache)[0] for t in range(6)]
    assert_close(torch.cat(steps, 1), m(x)[0], atol=1e-6)


@MODES
@pytest.mark.parametrize("need_weights", [True, False])
def test_gradients_through_the_cache_equal_those_of_one_causal_call(max_len, need_weights):
    # Training through a cache (or a loss on generated tokens): every step's backward pass needs the keys as
    # that step saw them, although a preallocated cache writes the next ones into the same buffers.
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 7, 16, dtype=torch.float64)
    params = [x, *m.parameters()]
    full = torch.autograd.grad((m(x)[0] * weights).sum(), params)
    cache = mha.KVCache(max_len=max_len)
    steps = [m(x[:, t : t + 2], cache=cache, need_weights=need_weights)[0] for t in range(0, 7, 2)]
    stepped = torch.autograd.grad((torch.cat(steps, 1) * weights).sum(), params)
    for a, b in zip(stepped, full):
        assert_close(a, b, atol=1e-12)


@MODES
def test_a_cache_filled_under_inference_mode_keeps_working_outside_it_and_back(max_len):
    # The fault: a preallocated cache filled under torch.inference_mode() raised torch's "Inplace update to
    # inference tensor outside InferenceMode" at the next step outside it.
    m = mha.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    cache = mha.KVCache(max_len=max_len)
    with torch.inference_mode():
        m(x[:, :3], cache=cache)
    steps = [m(x[:, t : t + 1], cache=cache)[0] for t in range(3, 5)]  # outside, gradients on
    with torch.no_grad():
        steps.append(m(x[:, 5:6], cache=cache)[0])
    with torch.inference_mode():  # and back inside
        steps.append(m(x[:, 6:7], cache=cache)[0])
    with torch.no_grad():
        assert_close(torch.cat(steps, 1), m(x)[0][:, 3:], atol=1e-6)
    assert len(cache) == 7


@MODES
def test_update_takes_keys_and_values_of_one_shape(max_len):
    cache = mha.KVCache(max_len=max_len)
    with pytest.raises(ValueError, match=r"one shape \(B, n_kv_heads, T_new, d_k\), got k \(1, 2, 3, 4\) and v \(1, 2"):
        cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3))
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor, got list"):
        cache.update([0.0], torch.randn(1, 2, 3, 4))
    assert len(cache) == 0
