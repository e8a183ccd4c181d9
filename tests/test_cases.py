"""Regression tests for ../shared/cases/attention-cases.md: inputs that broke real users' attention code.

Each test is named after its case id and fixes the whole kind of fault.
"""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, torch_reference
from torch import nn

import mha


def test_C1_tril_mask_is_converted_for_nn_multiheadattention():
    m = mha.MultiHeadAttention(8, 2)
    x = torch.randn(1, 4, 8)
    tril = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    # The fault: PyTorch reads True as *blocked*, so the raw mask attends to the future.
    _, w_raw = mha.to_torch(m)(x, x, x, attn_mask=tril, average_attn_weights=False)
    assert torch.isnan(w_raw[0, :, 3]).all()
    # The fix: the interop helper converts the convention.
    y, w = m(x, mask=tril, causal=False)
    y_ref, w_ref = mha.to_torch(m)(x, x, x, attn_mask=mha.to_torch_attn_mask(tril), average_attn_weights=False)
    assert_close(y, y_ref, atol=1e-6)
    assert_close(w, w_ref, atol=1e-6)
    assert w[0, :, 0].tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2
    # Per-head / per-sample masks convert too, to PyTorch's (B*h, T, S) layout.
    keep = torch.rand(1, 2, 4, 4) > 0.3
    keep[..., 0] = True
    y, w = m(x, mask=keep, causal=False)
    y_ref, w_ref = torch_reference(m, x, keep=keep)
    assert_close(w, w_ref, atol=1e-6)


def test_C2_float_01_mask_blocks_and_additive_mask_raises():
    T = 4
    m = mha.MultiHeadAttention(8, 2)
    tril = torch.tril(torch.ones(T, T))  # float 0/1, the previous post's style
    x = torch.randn(1, T, 8)
    x2 = x.clone()
    x2[:, 3] = torch.randn(8)
    for need_weights in (True, False):
        y = m(x, mask=tril, causal=False, need_weights=need_weights)[0]
        y2 = m(x2, mask=tril, causal=False, need_weights=need_weights)[0]
        assert torch.equal(y[:, 0], y2[:, 0])
    q = torch.randn(1, T, 8)
    additive = torch.zeros(T, T).masked_fill(~tril.bool(), float("-inf"))
    with pytest.raises(ValueError, match="keep-mask.*additive"):
        mha.scaled_dot_product_attention(q, q, q, additive)
    with pytest.raises(ValueError, match="0 and 1"):
        m(x, mask=additive)
    with pytest.raises(ValueError, match="0 and 1"):
        mha.scaled_dot_product_attention(q, q, q, tril * 0.5)  # any other value, not only -inf


def test_C3_bool_mask_agrees_with_pytorch_sdpa():
    q, k, v = (torch.randn(1, 1, 4, 4) for _ in range(3))
    tril = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for need_weights in (True, False):
        out, _ = mha.scaled_dot_product_attention(q, k, v, tril, need_weights=need_weights)
        assert_close(out, expected, atol=1e-6)
        out, _ = mha.scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=need_weights)
        assert_close(out, expected, atol=1e-6)


@pytest.mark.parametrize("train", [False, True])
def test_C4_fully_masked_sample_poisons_nothing(train):
    m = mha.MultiHeadAttention(8, 2, dropout=0.1).train(train)
    x = torch.randn(2, 4, 8, requires_grad=True)
    keep = mha.padding_mask([4, 0], 4)[:, None, None, :]  # sample 1: every key masked
    results = []
    for need_weights in (True, False):
        torch.manual_seed(1)
        y, w = m(x, mask=keep, need_weights=need_weights)
        assert torch.isfinite(y).all()
        if w is not None:
            assert torch.equal(w[1], torch.zeros(2, 4, 4))
        # Fully masked rows give zero attention output, so y is just W_O's bias there.
        assert torch.equal(y[1], m.out.bias.expand(4, 8))
        x.grad = None
        y[0].sum().backward()
        assert torch.isfinite(x.grad).all()
        assert torch.equal(x.grad[1], torch.zeros(4, 8))
        results.append(y)
    if not train:
        alone, _ = m(x[:1])
        assert_close(results[0][:1], alone, atol=1e-6)
        assert_close(results[1], results[0], atol=1e-6)


def test_C4_fully_masked_head_in_function():
    q = torch.randn(2, 2, 4, 3)
    keep = torch.ones(2, 2, 4, 4, dtype=torch.bool)
    keep[1, 0] = False  # one head of one sample sees nothing
    for need_weights in (True, False):
        out, _ = mha.scaled_dot_product_attention(q, q, q, keep, need_weights=need_weights)
        assert torch.isfinite(out).all() and torch.equal(out[1, 0], torch.zeros(4, 3))
        alone, _ = mha.scaled_dot_product_attention(q[0], q[0], q[0])
        assert_close(out[0], alone, atol=1e-6)


def test_C5_causal_with_fewer_queries_is_bottom_right():
    q = torch.randn(1, 1, 1, 4)
    k, v = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    unmasked, _ = mha.scaled_dot_product_attention(q, k, v)
    for need_weights in (True, False):
        out, _ = mha.scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=need_weights)
        assert_close(out, unmasked, atol=1e-6)
    assert mha.causal_mask(2, 5).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    _, w = mha.scaled_dot_product_attention(torch.randn(1, 2, 4), k[0], v[0], is_causal=True)
    assert (w[0] > 0).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_C6_heads_are_merged_in_the_right_order():
    out = torch.randn(2, 4, 5, 3)  # (B, h, T, d_k)
    merged = mha.merge_heads(out)
    assert merged.shape == (2, 5, 12)
    # Time step t of the merged output holds head 0's row t, then head 1's, ...
    assert torch.equal(merged[1, 2], torch.cat([out[1, i, 2] for i in range(4)]))
    assert torch.equal(mha.split_heads(merged, 4), out)
    assert not torch.equal(out.reshape(2, 5, 12), merged)  # the wrong merge really differs
    m = mha.MultiHeadAttention(12, 4).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    y_ref, _ = torch_reference(m, x, keep=mha.causal_mask(5))
    assert_close(m(x)[0], y_ref, atol=1e-12)


def test_C7_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"d_model=512.*h=6"):
        mha.MultiHeadAttention(512, 6)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_C8_dropout_is_off_in_eval(need_weights, n_kv_heads):
    m = mha.MultiHeadAttention(16, 4, dropout=0.5, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, 5, 16)
    a = m(x, need_weights=need_weights)[0]
    b = m(x, need_weights=need_weights)[0]
    assert torch.equal(a, b)
    # And the same through a cache (both kinds), and for cross-attention.
    def decode(max_len):
        cache = mha.KVCache(max_len=max_len)
        return torch.cat([m(x[:, t : t + 1], cache=cache, need_weights=need_weights)[0] for t in range(5)], 1)

    for max_len in (None, 5):
        assert torch.equal(decode(max_len), decode(max_len))
    context = torch.randn(2, 3, 16)
    assert torch.equal(m(x, context, need_weights=need_weights)[0], m(x, context, need_weights=need_weights)[0])


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("bias", [True, False])
def test_C9_weight_copy_round_trip(dtype, tol, bias):
    m = mha.MultiHeadAttention(16, 4, bias=bias).to(dtype)
    back = mha.from_torch(mha.to_torch(m))
    for (name, a), (_, b) in zip(m.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name
    x = torch.randn(2, 5, 16, dtype=dtype)
    ref = mha.to_torch(m)
    assert torch.equal(ref.in_proj_weight[:16], m.qkv.weight[:16])  # W_Q first, in (out, in) layout
    y_ref, w_ref = ref(x, x, x, attn_mask=mha.to_torch_attn_mask(mha.causal_mask(5)), average_attn_weights=False)
    y, w = back(x)
    assert_close(y, y_ref, atol=tol)
    assert_close(w, w_ref, atol=tol)


def test_C9_wrong_layouts_are_really_wrong():
    # The silent faults: K, Q, V order or transposed blocks give other outputs. Our copy does not.
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=True).double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    y_ref, _ = ref(x, x, x)
    m = mha.from_torch(ref)
    assert_close(m(x, causal=False)[0], y_ref, atol=1e-12)
    W_Q, W_K, W_V = ref.in_proj_weight.detach().chunk(3)
    for wrong in (torch.cat([W_K, W_Q, W_V]), torch.cat([W_Q.T, W_K.T, W_V.T])):
        with torch.no_grad():
            m.qkv.weight.copy_(wrong)
        assert not torch.allclose(m(x, causal=False)[0], y_ref)


def test_C2_all_zero_float_mask_is_refused():
    # An additive mask that blocks nothing is all zeros; read as a keep-mask it would block everything.
    m = mha.MultiHeadAttention(8, 2)
    nothing_blocked = mha.to_additive_mask(mha.padding_mask([3, 3]))[:, None, None, :]
    with pytest.raises(ValueError, match="all zeros"):
        m(torch.randn(2, 3, 8), mask=nothing_blocked, causal=False)
    # An all-False bool mask is unambiguous: every row is blocked and comes out zero.
    out, w = mha.scaled_dot_product_attention(*(torch.randn(1, 3, 4),) * 3, torch.zeros(3, 3, dtype=torch.bool))
    assert torch.equal(out, torch.zeros(1, 3, 4)) and torch.equal(w, torch.zeros(1, 3, 3))


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_C10_compiled_layer_matches_eager(need_weights, dynamic, graphs):
    # The fault: length logic in plain Python (`T == S` handed to is_causal, int checks on sizes)
    # fails once torch.compile makes the lengths symbolic.
    m = mha.MultiHeadAttention(16, 4).eval()
    f = torch.compile(m, backend=graphs, fullgraph=True, dynamic=dynamic)
    for T in (7, 11):
        x = torch.randn(2, T, 16)
        y, w = f(x, need_weights=need_weights)
        y_ref, w_ref = m(x, need_weights=need_weights)
        assert_close(y, y_ref, atol=1e-6)
        if need_weights:
            assert_close(w, w_ref, atol=1e-6)
        else:
            assert w is None
    assert graphs.count == (1 if dynamic else 2)  # dynamic: one graph serves every length


@pytest.mark.slow
@pytest.mark.parametrize("max_len", [None, 32], ids=["growing", "preallocated"])
@pytest.mark.parametrize("need_weights, n_kv_heads", [(True, None), (False, None), (False, 2)])
def test_C10_compiled_decode_loop_with_kv_cache(need_weights, n_kv_heads, max_len, graphs):
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads).eval()
    steps = 32
    x = torch.randn(2, steps, 16)
    full, w_full = m(x)
    step = torch.compile(m, backend=graphs, fullgraph=True)
    cache = mha.KVCache(max_len=max_len)
    ys, counts = [], []
    for t in range(steps):
        y, w = step(x[:, t : t + 1], cache=cache, need_weights=need_weights)
        ys.append(y)
        if need_weights:  # the new token's row of the full causal table
            assert_close(w, w_full[:, :, t : t + 1, : t + 1], atol=1e-6)
        counts.append(graphs.count)
    assert_close(torch.cat(ys, dim=1), full, atol=1e-6)
    assert len(cache) == steps
    # The cache's length is Python state (its keys' size), so each new length first looks like a new input.
    # Sizes 0 and 1 are always specialised; from the third step on dynamo treats the length as symbolic and one
    # graph serves every step: an empty cache, one cached position, any longer. No recompiling per step.
    if max_len is None:
        assert counts[-1] <= 3
    else:  # the first step also allocates the buffers
        assert counts[:3] == [1, 2, 3] and counts[3:-1] == [3] * (steps - 4)
        # One exception: the step that fills the buffers to max_len attends over all of them, which is
        # contiguous, and PyTorch guards on that (the explicit path on torch 2.13; both paths on torch 2.6).
        assert counts[-1] <= 4


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_C10_a_mask_of_the_wrong_shape_raises_the_eager_message_under_compile(dynamic, graphs):
    # The fault: the shape check called torch.broadcast_shapes, which fails inside dynamo's fake tensors, so a
    # compiled layer raised dynamo's TorchRuntimeError instead of the ValueError that says what to pass.
    m = mha.MultiHeadAttention(16, 4).eval()
    f = torch.compile(m, backend=graphs, dynamic=dynamic)
    x = torch.randn(2, 5, 16)
    pad = mha.padding_mask([5, 3])
    y, _ = f(x, mask=pad[:, None, None, :])
    assert_close(y, m(x, mask=pad[:, None, None, :])[0], atol=1e-6)
    for mask, message in ((pad, r"= \(2, 4, 5, 5\); a \(B, S\) padding mask goes in as mask\[:, None, None, :\]"),
                          (torch.ones(3, 5, 5, dtype=torch.bool), r"mask of shape \(3, 5, 5\) does not broadcast")):
        with pytest.raises(ValueError, match=message):
            f(x, mask=mask)
    assert graphs.count >= 1  # it compiled (the calls that raised run eagerly, as dynamo runs any frame that raises)
    y, _ = f(x, mask=pad[:, None, None, :])
    assert_close(y, m(x, mask=pad[:, None, None, :])[0], atol=1e-6)


@pytest.mark.parametrize("need_weights", [True, False])
def test_C11_stacked_layers_under_bfloat16_autocast(need_weights):
    # The fault: the second layer refused the bfloat16 activations autocast hands it from the first.
    m1, m2 = mha.MultiHeadAttention(16, 4), mha.MultiHeadAttention(16, 4)
    t1, t2 = mha.to_torch(m1), mha.to_torch(m2)
    x = torch.randn(2, 5, 16)
    blocked = mha.to_torch_attn_mask(mha.causal_mask(5))

    def stack(layers, params, autocast):
        x_ = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = x_
            for layer in layers:
                y = layer(y)
        return y, torch.autograd.grad(y.float().square().sum(), [x_, *params])

    ours = [lambda x, m=m: m(x, need_weights=need_weights)[0] for m in (m1, m2)]
    params = [*m1.parameters(), *m2.parameters()]
    y32, grads32 = stack(ours, params, autocast=False)
    y16, grads16 = stack(ours, params, autocast=True)
    assert y16.dtype == torch.bfloat16 and all(p.dtype == torch.float32 for p in params)
    assert torch.isfinite(y16).all() and all(torch.isfinite(g).all() for g in grads16)
    assert_close(y16.float(), y32, atol=2e-2)
    for g16, g32 in zip(grads16, grads32):  # x's gradient and every parameter's
        assert_close(g16, g32, atol=2e-2 * g32.abs().max().item())
    # PyTorch's own layer, same weights, same autocast: the same answer to bfloat16's precision.
    theirs = [lambda x, t=t: t(x, x, x, attn_mask=blocked)[0] for t in (t1, t2)]
    y_torch, _ = stack(theirs, [*t1.parameters(), *t2.parameters()], autocast=True)
    assert_close(y16.float(), y_torch.float(), atol=2e-2)


@pytest.mark.parametrize("need_weights", [True, False])
def test_C11_function_accepts_what_autocast_produces(need_weights):
    q = torch.randn(1, 2, 5, 8)
    k, v = torch.randn(1, 2, 5, 8, dtype=torch.bfloat16), torch.randn(1, 2, 5, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha.scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=need_weights)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == expected.dtype == torch.bfloat16
    assert_close(out.float(), expected.float(), atol=2e-2)
    with pytest.raises(TypeError, match=r"share a dtype.*torch.autocast"):
        mha.scaled_dot_product_attention(q, k, v, need_weights=need_weights)


def test_C11_dtype_mismatch_outside_autocast_gives_advice_for_both_uses():
    m = mha.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    advice = r"convert the module: module.to\(torch.bfloat16\).*torch.autocast\('cpu', dtype=torch.bfloat16\)"
    with pytest.raises(TypeError, match=advice):
        m(x)
    # Both pieces of advice work: autocast for mixed precision, module.to for bfloat16 throughout.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(x)[0].dtype == torch.bfloat16
    assert mha.MultiHeadAttention(16, 4).to(torch.bfloat16)(x)[0].dtype == torch.bfloat16
    # Autocast never casts float64, so float64 activations still need a float64 module, and a float64
    # module is never advised to use autocast.
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match=r"x is torch.float64"):
        m(x.double())
    with pytest.raises(TypeError, match=r"convert one of them") as err:
        mha.MultiHeadAttention(16, 4).double()(x)
    assert "autocast" not in str(err.value)


def test_C11_float64_mixed_in_under_autocast_is_named_as_passed():
    # The fault: float32 q with float64 k under bfloat16 autocast reported q as bfloat16 (autocast's cast, not what
    # was passed) and advised running under torch.autocast, which was already on.
    q = torch.randn(2, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError) as err:
        mha.scaled_dot_product_attention(q, q.double(), q)
    assert str(err.value) == ("q, k, v must share a dtype, got torch.float32, torch.float64, torch.float32; "
                              "torch.autocast casts the others to torch.bfloat16 but never float64: cast those to "
                              "float32")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the advice works
        assert mha.scaled_dot_product_attention(q, q, q)[0].dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"got torch.float32, torch.float64, torch.float32; cast them to one"):
        mha.scaled_dot_product_attention(q, q.double(), q)  # outside autocast, as before


def _bytes_kept_alive(cache):
    k, v = cache.k.untyped_storage(), cache.v.untyped_storage()
    assert k.data_ptr() != v.data_ptr()  # two storages, so neither is counted twice
    return k.nbytes() + v.nbytes()


@pytest.mark.parametrize("n_kv_heads", [2, None])
def test_C12_kv_cache_nbytes_is_what_it_keeps_alive(n_kv_heads):
    # The fault: after a prefill the cache held views into the fused qkv output, Q included.
    m = mha.MultiHeadAttention(64, 8, n_kv_heads=n_kv_heads)
    g = n_kv_heads or 8
    cache = mha.KVCache()
    with torch.no_grad():
        m(torch.randn(2, 7, 64), cache=cache)  # prefill
        assert cache.nbytes == _bytes_kept_alive(cache) == 2 * 2 * g * 7 * 8 * 4  # K and V, float32
        if n_kv_heads == 2:
            assert cache.nbytes == 1792
        for chunk in (1, 1, 3, 1):  # single steps and chunks
            m(torch.randn(2, chunk, 64), cache=cache)
            assert cache.nbytes == _bytes_kept_alive(cache) == 2 * 2 * g * len(cache) * 8 * 4
    assert len(cache) == 13
    # A one-token prefill gives contiguous views; the cache copies those too.
    cache = mha.KVCache()
    m(torch.randn(1, 1, 64), cache=cache)
    assert cache.nbytes == _bytes_kept_alive(cache) == 2 * g * 8 * 4


@pytest.mark.parametrize("n_kv_heads", [2, None])
def test_C12_preallocated_kv_cache_nbytes_is_its_whole_buffers(n_kv_heads):
    # A preallocated cache keeps its (B, g, max_len, d_k) buffers alive from the first update on, however few
    # positions are filled: nbytes counts them whole, and still nothing of the fused qkv output.
    m = mha.MultiHeadAttention(64, 8, n_kv_heads=n_kv_heads)
    g = n_kv_heads or 8
    cache = mha.KVCache(max_len=16)
    with torch.no_grad():
        m(torch.randn(2, 7, 64), cache=cache)  # prefill
        assert cache.nbytes == _bytes_kept_alive(cache) == 2 * 2 * g * 16 * 8 * 4  # K and V buffers, float32
        for chunk in (1, 1, 3, 1):
            m(torch.randn(2, chunk, 64), cache=cache)
            assert cache.nbytes == _bytes_kept_alive(cache) == 2 * 2 * g * 16 * 8 * 4
    assert len(cache) == 13
    cache = mha.KVCache(max_len=4)
    m(torch.randn(1, 1, 64), cache=cache)  # a one-token prefill: its K and V are views into qkv's output
    assert cache.nbytes == _bytes_kept_alive(cache) == 2 * g * 4 * 8 * 4


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 1e10])
@pytest.mark.parametrize("need_weights", [True, False])
def test_C14_keys_blocked_for_every_query_never_reach_the_output(bad, need_weights):
    q = (torch.arange(8, dtype=torch.float64).reshape(1, 2, 4) / 8).requires_grad_()
    keep = torch.tensor([[[True, False], [True, False]]])  # key 1 is blocked for both queries
    finite = q.detach().clone()
    k = finite.clone()
    k[0, 1, 0] = bad
    k.requires_grad_()
    v = k.detach().clone().requires_grad_()
    if bad != 1e10:  # the fault: PyTorch's kernel lets the blocked key through as NaN
        assert torch.isnan(F.scaled_dot_product_attention(q, k, v, attn_mask=keep)).all()
    expected = F.scaled_dot_product_attention(finite, finite, finite, attn_mask=keep)  # key 1 finite
    out, w = mha.scaled_dot_product_attention(q, k, v, keep, need_weights=need_weights)
    assert_close(out, expected)
    assert torch.equal(out, finite[:, :1].expand(1, 2, 4))  # each query sees only key 0: out is v[0]
    if need_weights:
        assert w.tolist() == [[[1.0, 0.0], [1.0, 0.0]]]
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert k.grad[0, 1].abs().max() == 0 and v.grad[0, 1].abs().max() == 0  # nothing flows to the blocked key


@pytest.mark.parametrize("need_weights", [True, False])
def test_C14_a_fully_blocked_row_stays_exactly_zero_whatever_it_holds(need_weights):
    q, k, v = (torch.randn(2, 2, 3, 4, dtype=torch.float64) for _ in range(3))
    q[1], k[1], v[1] = float("nan"), float("nan"), float("nan")  # sample 1 is all padding, garbage included
    keep = mha.padding_mask([3, 0])[:, None, None, :]  # (B, 1, 1, S): sample 1 has no key
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, w = mha.scaled_dot_product_attention(q, k, v, keep, need_weights=need_weights)
    assert out[1].abs().max() == 0 and (w is None or w[1].abs().max() == 0)  # exactly zero, not NaN
    alone = F.scaled_dot_product_attention(q[0], k[0], v[0])
    assert_close(out[0], alone)
    out[0].sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all() and t.grad[1].abs().max() == 0
    # A row with no key stays zero even when the keys it does not see are NaN that another row sees.
    q, k, v = (torch.randn(1, 2, 2, 4, dtype=torch.float64) for _ in range(3))
    k[..., 1, :] = float("nan")
    keep = torch.tensor([[False, False], [True, True]])
    out, w = mha.scaled_dot_product_attention(q, k, v, keep, need_weights=need_weights)
    assert out[..., 0, :].abs().max() == 0 and (w is None or w[..., 0, :].abs().max() == 0)
    assert torch.isnan(out[..., 1, :]).all()  # row 1 asked for the NaN key: that is its answer


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_C14_nan_in_padded_rows_of_x_leaves_the_real_tokens_alone(causal, need_weights):
    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64).eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    x[1, 4:] = float("nan")  # what an upstream layer may leave on padding (pytorch/pytorch#41508)
    lengths = [6, 4]
    y, w = m(x, mask=mha.padding_mask(lengths)[:, None, None, :], causal=causal, need_weights=need_weights)
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[1, :4]).all()
    for b, n in enumerate(lengths):  # each sample as if it had never been padded
        alone, w_alone = m(x[b : b + 1, :n], causal=causal)
        assert_close(y[b, :n], alone[0], atol=1e-12)
        if need_weights:
            assert_close(w[b, :, :n, :n], w_alone[0], atol=1e-12)
            assert not w[b, :, :n, n:].any()  # padding keys get exactly zero weight from real queries


def test_C14_gradients_of_a_loss_on_the_real_tokens_stay_finite():
    # The recipe of padding_mask's docstring, forward's and docs/mask_convention.md: the gradient with respect to the
    # real tokens is the one without the padding when the mask says which *queries* are padding too (B, 1, T, S).
    # With the key-padding mask alone a padded query's NaN reaches every key's gradient as 0 * NaN, in any
    # implementation (and a NaN row of x reaches nn.Linear's weight gradient so, unless it is replaced).
    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64).eval()
    lengths = [6, 4]
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    x[1, 4:] = float("nan")
    x.requires_grad_()
    pad = mha.padding_mask(lengths)
    keep = pad[:, None, :, None] & pad[:, None, None, :]  # (B, 1, T, S): real queries, real keys
    for need_weights in (True, False):
        x.grad = None
        y, _ = m(x, mask=pad[:, None, None, :], need_weights=need_weights)  # the key-padding mask alone
        (y * pad[..., None]).nan_to_num().sum().backward()  # a loss on the real tokens only
        assert torch.isfinite(y[1, :4]).all() and torch.isnan(x.grad[1, :4]).any()  # outputs right, gradients not
        x.grad = None
        y, _ = m(x, mask=keep, need_weights=need_weights)
        (y * pad[..., None]).nan_to_num().sum().backward()
        assert torch.isfinite(x.grad).all() and x.grad[1, 4:].abs().max() == 0
        part = x.detach()[1:, :4].clone().requires_grad_()
        m(part)[0].sum().backward()
        assert_close(x.grad[1, :4], part.grad[0], atol=1e-12)
    # And the weights' gradients, once the NaN rows are replaced: those of the unpadded sequences.
    m.zero_grad()
    y, _ = m(x.detach().masked_fill(~pad[..., None], 0), mask=keep)
    (y * pad[..., None]).sum().backward()
    padded = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    for b, n in enumerate(lengths):
        m(x.detach()[b : b + 1, :n])[0].sum().backward()
    for a, b in zip(padded, [p.grad for p in m.parameters()]):
        assert_close(a, b, atol=1e-12)
    # Cross-attention: NaN in the padded rows of the context (an encoder's output) stays out of every gradient
    # but W_K's and W_V's, which multiply those rows (nn.Linear's weight gradient: 0 * NaN).
    m.zero_grad()
    x = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    context = torch.randn(2, 6, 16, dtype=torch.float64)
    context[1, 4:] = float("nan")
    context.requires_grad_()
    y, _ = m(x, context, mask=pad[:, None, None, :])
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(context.grad).all()
    assert torch.isfinite(m.out.weight.grad).all() and torch.isfinite(m.qkv.weight.grad[:16]).all()  # W_O, W_Q


@pytest.mark.parametrize("max_len", [None, 16], ids=["growing", "preallocated"])
@pytest.mark.parametrize("as_list", [True, False], ids=["list", "tensor"])
def test_C18_reordering_the_cache_for_beam_search_equals_recomputing(max_len, as_list):
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=torch.float64).eval()
    prefix = torch.randn(3, 4, 16, dtype=torch.float64)  # three beams, four tokens each
    cache = mha.KVCache(max_len=max_len)
    with torch.no_grad():
        for t in range(4):
            m(prefix[:, t : t + 1], cache=cache)
        beams = [2, 0, 0]  # new beams 0, 1, 2 continue old beams 2, 0, 0
        cache.reorder(beams if as_list else torch.tensor(beams))
        tokens = torch.randn(3, 2, 16, dtype=torch.float64)
        steps = [m(tokens[:, t : t + 1], cache=cache)[0] for t in range(2)]
        recomputed, _ = m(torch.cat([prefix[beams], tokens], dim=1))  # the reordered prefixes, from scratch
    assert_close(torch.cat(steps, 1), recomputed[:, 4:], atol=1e-12)
    assert len(cache) == 6 and cache.k.shape == (3, 2, 6, 4)
    # The old way round, assigning the rows, would be ignored by a preallocated cache: it is refused in both.
    for name in ("k", "v", "max_len"):
        with pytest.raises(AttributeError, match=rf"KVCache.{name} cannot be assigned.*cache.reorder\(beams\)"):
            setattr(cache, name, getattr(cache, name))


def test_C18_beams_may_change_the_batch_and_are_checked():
    m = mha.MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 3, 8)
    for max_len in (None, 8):
        cache = mha.KVCache(max_len=max_len)
        m(x, cache=cache)
        cache.reorder([1, 1, 0, 1])  # four beams out of two
        y, _ = m(torch.zeros(4, 1, 8), cache=cache)
        expected, _ = m(torch.cat([x[[1, 1, 0, 1]], torch.zeros(4, 1, 8)], 1))
        assert_close(y, expected[:, 3:], atol=1e-6)
        for beams, error, message in (([0, 4], ValueError, r"\[0, B=4\), got \[0, 4\]"),
                                      (torch.tensor([[0, 1]]), ValueError, r"1-D \(new batch,\), got shape \(1, 2\)"),
                                      ([0.0], TypeError, r"batch row indices \(ints\), got \[0.0\]"),
                                      (torch.tensor([1.0]), TypeError, r"integer tensor")):
            with pytest.raises(error, match=message):
                cache.reorder(beams)
        assert cache.k.size(0) == 4
    mha.KVCache().reorder([2, 0])  # an empty cache has nothing to reorder


@pytest.mark.parametrize("max_len", [None, 16], ids=["growing", "preallocated"])
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_C18_a_copied_cache_forks_a_beam_that_equals_recomputing_its_prefix(max_len, how, grad):
    # The fault: copy.copy of a preallocated cache shared its buffers (each branch wrote over the other's keys, off
    # by 0.28); deepcopy copied the owner layer too (the layer then refused its own cache), or failed inside torch
    # with gradients on.
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=torch.float64).eval()
    prefix = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=grad)
    a, b = torch.randn(2, 2, 16, dtype=torch.float64), torch.randn(2, 2, 16, dtype=torch.float64)
    cache = mha.KVCache(max_len=max_len)
    with torch.set_grad_enabled(grad):
        m(prefix, cache=cache)
        fork = how(cache)
        forked, kept = [], []
        for t in range(2):  # the two branches step in turn, each after the other wrote
            forked.append(m(a[:, t : t + 1], cache=fork)[0])
            kept.append(m(b[:, t : t + 1], cache=cache)[0])
        assert_close(torch.cat(forked, 1), m(torch.cat([prefix, a], 1))[0][:, 3:])
        assert_close(torch.cat(kept, 1), m(torch.cat([prefix, b], 1))[0][:, 3:])
    assert len(fork) == len(cache) == 5 and fork.max_len == max_len
    if grad:  # the copy's keys are clones: a loss on the forked branch reaches the prefix that computed them
        stepped = torch.autograd.grad(torch.cat(forked, 1).sum(), prefix)[0]
        full = torch.autograd.grad(m(torch.cat([prefix, a], 1))[0][:, 3:].sum(), prefix)[0]
        assert_close(stepped, full)
    # The same owner: another layer is refused by the copy as by the original.
    with pytest.raises(ValueError, match=r"holds the keys of another layer"):
        mha.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=torch.float64)(a[:, :1], cache=fork)


@pytest.mark.parametrize("saved, loading, names", [
    ((32, 4, {}), (32, 8, {}), r"h=4, n_kv_heads=4, d_k=8, but this layer has h=8, n_kv_heads=8, d_k=4"),
    ((32, 8, {"n_kv_heads": 4}), (32, 4, {"n_kv_heads": 2}), r"h=8, n_kv_heads=4, d_k=4, .* h=4, n_kv_heads=2, d_k=8"),
    ((32, 4, {"d_k": 8}), (32, 2, {"d_k": 16}), r"h=4, n_kv_heads=4, d_k=8, .* h=2, n_kv_heads=2, d_k=16"),
])
def test_C19_a_checkpoint_of_another_head_count_is_refused(saved, loading, names):
    source = mha.MultiHeadAttention(saved[0], saved[1], **saved[2])
    target = mha.MultiHeadAttention(loading[0], loading[1], **loading[2])
    assert [p.shape for p in source.parameters()] == [p.shape for p in target.parameters()]  # it would load
    before = [p.clone() for p in target.parameters()]
    state = source.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)  # the head counts survive saving and loading (torch.load's weights_only default)
    buffer.seek(0)
    for checkpoint in (state, torch.load(buffer)):
        for strict in (True, False):
            with pytest.raises(ValueError, match=names):
                target.load_state_dict(checkpoint, strict=strict)
    with pytest.raises(ValueError, match=names):  # inside a model too
        nn.Sequential(target).load_state_dict(nn.Sequential(source).state_dict())
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))  # nothing was copied


def _strip_prefix(state):
    return {k.removeprefix("module."): v for k, v in state.items()}


# Ways a state_dict is rebuilt on its way to a layer (case C19): the head counts must survive every one.
REBUILT = {
    "dict(sd)": dict,
    "comprehension": lambda sd: {k: v for k, v in sd.items()},
    "half, then float": lambda sd: {k: v.half().float() for k, v in sd.items()},
    "bfloat16": lambda sd: {k: v.bfloat16() for k, v in sd.items()},
    "module. prefix stripped": lambda sd: _strip_prefix({f"module.{k}": v for k, v in sd.items()}),
}


@pytest.mark.parametrize("rebuild", REBUILT.values(), ids=REBUILT.keys())
def test_C19_the_head_counts_survive_a_rebuilt_state_dict(rebuild):
    # The fault: the counts lived in state_dict._metadata, which every rebuilt dict drops, so a (32, 4) checkpoint
    # loaded into MultiHeadAttention(32, 8) without a word.
    source, target = mha.MultiHeadAttention(32, 4), mha.MultiHeadAttention(32, 8)
    before = [t.clone() for t in target.state_dict().values()]
    for strict in (True, False):
        with pytest.raises(ValueError, match=r"from a layer with h=4, n_kv_heads=4, d_k=8, but this layer has h=8"):
            target.load_state_dict(rebuild(source.state_dict()), strict=strict)
    assert all(torch.equal(a, b) for a, b in zip(before, target.state_dict().values()))  # nothing was copied
    same = mha.MultiHeadAttention(32, 4, dtype=torch.float64)  # the same sizes load, whatever the dtype
    same.load_state_dict(rebuild(source.state_dict()))
    x = torch.randn(2, 3, 32)
    assert_close(same(x.double())[0], source(x)[0].double(), atol=1e-2)  # bfloat16 weights round


def test_C19_the_head_counts_survive_safetensors():
    safetensors = pytest.importorskip("safetensors.torch")
    source, target = mha.MultiHeadAttention(32, 4, n_kv_heads=2), mha.MultiHeadAttention(32, 4, n_kv_heads=4)
    saved = safetensors.load(safetensors.save(source.state_dict()))
    with pytest.raises(ValueError, match=r"n_kv_heads=2, d_k=8, but this layer has h=4, n_kv_heads=4, d_k=8"):
        target.load_state_dict(saved)
    copy_ = mha.MultiHeadAttention(32, 4, n_kv_heads=2)
    copy_.load_state_dict(saved)
    x = torch.randn(2, 3, 32)
    assert torch.equal(copy_(x)[0], source(x)[0])


def test_C19_half_and_to_dtype_keep_the_head_counts_integer():
    m = mha.MultiHeadAttention(32, 4).half()
    assert m.state_dict()["_extra_state"].dtype == torch.int64
    assert m.to(torch.float64).state_dict()["_extra_state"].tolist() == [4, 4, 8]
    assert m.qkv.weight.dtype == torch.float64


def test_C19_the_same_sizes_and_0_2_checkpoints_load():
    source, target = mha.MultiHeadAttention(32, 4), mha.MultiHeadAttention(32, 4)
    state = source.state_dict()
    assert list(state) == ["_extra_state", "qkv.weight", "qkv.bias", "out.weight", "out.bias"]
    target.load_state_dict(state)
    x = torch.randn(2, 3, 32)
    assert torch.equal(target(x)[0], source(x)[0])
    # mha 0.2 saved no head counts: its checkpoints load as they always did, into any h, strict or not.
    old = mha.MultiHeadAttention(32, 8).state_dict()
    del old["_extra_state"]
    for strict in (True, False):
        result = target.load_state_dict(old, strict=strict)
        assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(target.qkv.weight, old["qkv.weight"])
    assert target.state_dict()["_extra_state"].tolist() == [4, 4, 8]
    # mha 0.3 saved them as a buffer, head_config: its checkpoints load, and one of other head counts is refused.
    for strict in (True, False):
        result = target.load_state_dict({**old, "head_config": torch.tensor([4, 4, 8])}, strict=strict)
        assert result.missing_keys == [] and result.unexpected_keys == []
        with pytest.raises(ValueError, match=r"from a layer with h=8, n_kv_heads=8, d_k=4, but this layer has h=4"):
            target.load_state_dict({**old, "head_config": torch.tensor([8, 8, 4])}, strict=strict)
    # A module with the same names (the benchmark's minimal layer, the article's class) loads ours without the
    # head counts, and ours loads its.
    plain = nn.Module()
    plain.qkv, plain.out = nn.Linear(32, 96), nn.Linear(32, 32)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"_extra_state\""):
        plain.load_state_dict(source.state_dict())
    plain.load_state_dict({k: v for k, v in source.state_dict().items() if k != "_extra_state"})
    target.load_state_dict(plain.state_dict())
    assert torch.equal(target(x)[0], source(x)[0])
    # strict=False keeps its meaning: missing and unexpected keys are reported, not raised.
    result = target.load_state_dict({"qkv.weight": state["qkv.weight"], "extra": torch.ones(1)}, strict=False)
    assert result.missing_keys == ["qkv.bias", "out.weight", "out.bias"] and result.unexpected_keys == ["extra"]
    # A layer made on the meta device and given memory by to_empty() (unset counts) loads a checkpoint of its sizes.
    empty = mha.MultiHeadAttention(32, 4, device="meta").to_empty(device="cpu")
    empty.load_state_dict(state)
    assert torch.equal(empty(x)[0], source(x)[0])
    # Head counts that are not three numbers are named.
    for key in ("_extra_state", "head_config"):
        with pytest.raises(ValueError, match=r"head_config in mha 0.3\) must be a tensor \[h, n_kv_heads, d_k\], "
                                             r"got \(2,\)"):
            target.load_state_dict({**old, key: torch.tensor([4, 4])})
    # And the weights still go to and from PyTorch's module.
    back = mha.from_torch(mha.to_torch(source))
    back.load_state_dict(source.state_dict())
    assert torch.equal(back(x)[0], source(x)[0])
