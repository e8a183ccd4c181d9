"""Grouped-query attention and the KV cache (mha/efficient.py), tested against the lesson class, in float64.

``GroupedQueryAttention`` with as many K/V heads as query heads is ``MultiHeadAttention`` weight for weight; with
fewer, it is a ``MultiHeadAttention`` whose W_K and W_V rows are the K/V heads repeated (as rasbt tests his bonus
variants). A ``KVCache`` decoding token by token gives what one causal call over the whole sequence gives.
"""

import copy

import pytest
import torch
from helpers import assert_close, examples
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint

import mha

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = pytest.mark.parametrize("max_len", [None, 16], ids=["growing", "preallocated"])
PATHS = pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])


def gqa(n_kv_heads=2, h=4, d_model=16, **kwargs):
    return mha.GroupedQueryAttention(d_model, h, n_kv_heads, dtype=torch.float64, **kwargs).eval()


def x64(*shape, **kwargs):
    return torch.randn(*shape, dtype=torch.float64, **kwargs)


def repeated_heads(m):
    """The MultiHeadAttention that m is: its W_K, W_V rows (and biases) with each K/V head repeated h/g times."""
    h, g, d_k = m.h, m.n_kv_heads, m.d_k
    plain = mha.MultiHeadAttention(m.d_model, h, bias=m.qkv.bias is not None, dtype=torch.float64).eval()

    def repeat(t):  # (g*d_k, ...) -> (h*d_k, ...): K/V head j serves query heads j*h/g .. (j+1)*h/g - 1
        return t.unflatten(0, (g, d_k)).repeat_interleave(h // g, 0).flatten(0, 1)

    with torch.no_grad():
        for name in ("weight", "bias") if m.qkv.bias is not None else ("weight",):
            q, k, v = getattr(m.qkv, name).split([h * d_k, g * d_k, g * d_k])
            getattr(plain.qkv, name).copy_(torch.cat([q, repeat(k), repeat(v)]))
        plain.out.load_state_dict(m.out.state_dict())
    return plain


def test_with_all_kv_heads_it_is_the_lesson_layer_from_the_same_seed():
    torch.manual_seed(3)
    plain = mha.MultiHeadAttention(16, 4, dtype=torch.float64)
    torch.manual_seed(3)
    m = mha.GroupedQueryAttention(16, 4, dtype=torch.float64)
    assert list(m.state_dict()) == list(plain.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), plain.state_dict().values()))
    x, context, keep = x64(2, 5, 16), x64(2, 3, 16), mha.padding_mask([3, 2])[:, None, None, :]
    for need_weights in (True, False):
        for args, kwargs in (((x,), {}), ((x, context), {"mask": keep})):
            kwargs["need_weights"] = need_weights
            assert all(torch.equal(a, b) for a, b in zip(m(*args, **kwargs), plain(*args, **kwargs)) if a is not None)


@examples(30)
@given(st.sampled_from([(4, 1), (4, 2), (6, 3), (2, 1)]), st.integers(1, 3), st.integers(1, 3), st.integers(1, 6),
       st.integers(1, 6), st.booleans(), st.booleans(), st.booleans())
def test_with_fewer_kv_heads_it_is_the_lesson_layer_with_repeated_kv_heads(heads, d_k, B, T, S, cross, masked, bias):
    (h, g), d_model = heads, heads[0] * d_k
    m = mha.GroupedQueryAttention(d_model, h, g, bias=bias, dtype=torch.float64).eval()
    plain = repeated_heads(m)
    x, context = x64(B, T, d_model), x64(B, S, d_model) if cross else None
    keep = mha.padding_mask(torch.randint(1, S + 1, (B,)), S)[:, None, None, :] if masked and cross else None
    y_ref, w_ref = plain(x, context, mask=keep)
    for need_weights in (True, False):
        y, w = m(x, context, mask=keep, need_weights=need_weights)
        assert_close(y, y_ref)
        if need_weights:
            assert_close(w, w_ref)


def test_fewer_kv_heads_shrink_the_projection_and_not_the_output():
    m = mha.GroupedQueryAttention(32, 4, 1, d_k=12)
    assert m.qkv.weight.shape == ((4 + 2) * 12, 32) and m.out.weight.shape == (32, 48)
    y, w = m(torch.randn(2, 5, 32))
    assert y.shape == (2, 5, 32) and w.shape == (2, 4, 5, 5)


# -- the KV cache: decoding equals one causal call ---------------------------------------------------------------


@MODES
@PATHS
@pytest.mark.parametrize("n_kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_decoding_with_a_cache_equals_one_causal_call_gradients_included(n_kv_heads, chunk, need_weights, max_len):
    m = gqa(n_kv_heads)
    x = x64(2, 7, 16, requires_grad=True)
    full, w_full = m(x)
    cache, ys = mha.KVCache(max_len=max_len), []
    for t in range(0, 7, chunk):
        y, w = m(x[:, t : t + chunk], cache=cache, need_weights=need_weights)
        ys.append(y)
        if need_weights:  # the new rows of the full causal table, against every cached key
            assert_close(w, w_full[:, :, t : t + chunk, : t + chunk])
    assert_close(torch.cat(ys, 1), full)
    assert len(cache) == 7
    weights = x64(2, 7, 16)
    params = [x, *m.parameters()]  # each step's backward needs the keys as that step saw them
    for a, b in zip(torch.autograd.grad((torch.cat(ys, 1) * weights).sum(), params),
                    torch.autograd.grad((full * weights).sum(), params)):
        assert_close(a, b)


@MODES
def test_decoding_padded_prompts_with_a_mask_over_every_cached_key(max_len):
    m, x, pad = gqa(), x64(2, 6, 16), mha.padding_mask([6, 4])
    full, _ = m(x, mask=pad[:, None, None, :])
    cache = mha.KVCache(max_len=max_len)
    ys = [m(x[:, t : t + 1], mask=pad[:, None, None, : t + 1], cache=cache)[0] for t in range(6)]
    assert_close(torch.cat(ys, 1), full)


@MODES
def test_a_cache_filled_under_inference_mode_keeps_decoding_outside_it(max_len):
    m, x = gqa(), x64(2, 5, 16)
    cache = mha.KVCache(max_len=max_len)
    with torch.inference_mode():
        m(x[:, :3], cache=cache)  # the prompt
    ys = [m(x[:, t : t + 1], cache=cache)[0] for t in (3, 4)]
    assert_close(torch.cat(ys, 1), m(x)[0][:, 3:])


def storage_bytes(cache):
    k, v = cache.k.untyped_storage(), cache.v.untyped_storage()
    return k.nbytes() + v.nbytes() if k.data_ptr() != v.data_ptr() else k.nbytes()


@pytest.mark.c12
@MODES
@pytest.mark.parametrize("n_kv_heads", [2, 8], ids=["gqa", "mha"])
def test_nbytes_is_the_bytes_of_the_storages_the_cache_keeps_alive(n_kv_heads, max_len):
    """C12: after GroupedQueryAttention(64, 8, 2)(torch.randn(2, 7, 64), cache=c) the cache held views into the
    whole fused projection output, 5,376 bytes, where its keys and values take 1,792."""
    m, cache = mha.GroupedQueryAttention(64, 8, n_kv_heads), mha.KVCache(max_len=max_len)
    with torch.no_grad():
        for T in (7, 1, 1, 3):  # a prefill, single steps and a chunk
            m(torch.randn(2, T, 64), cache=cache)
            assert cache.nbytes == storage_bytes(cache)
    if max_len is None and n_kv_heads == 2:
        cache.reset()
        with torch.no_grad():
            m(torch.randn(2, 7, 64), cache=cache)
        assert cache.nbytes == storage_bytes(cache) == 1792


# -- beams, copies, owners (C18) --------------------------------------------------------------------------------


@pytest.mark.c18
@MODES
def test_reordering_the_cache_for_beam_search_equals_recomputing_the_reordered_prefixes(max_len):
    """C18: with no reorder API, assigning cache.k, cache.v = cache.k[beams], cache.v[beams] worked for KVCache()
    and was silently ignored by KVCache(max_len=16) (off by 0.39)."""
    m, prefix, cache = gqa(), x64(3, 4, 16), mha.KVCache(max_len=max_len)
    with torch.no_grad():
        m(prefix, cache=cache)
        beams = [2, 0, 0, 1]  # new beams continue old beams 2, 0, 0 and 1
        cache.reorder(torch.tensor(beams))
        tokens = x64(4, 2, 16)
        ys = [m(tokens[:, t : t + 1], cache=cache)[0] for t in range(2)]
        assert_close(torch.cat(ys, 1), m(torch.cat([prefix[beams], tokens], 1))[0][:, 4:])
    k = cache.k
    for name in ("k", "v", "max_len"):  # what cannot be assigned safely cannot be assigned at all
        with pytest.raises(AttributeError):
            setattr(cache, name, None)
    assert cache.k is k


@MODES
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copied_cache_forks_a_beam_that_equals_recomputing_its_prefix(how, max_len):
    m, prefix, a, b = gqa(), x64(2, 3, 16), x64(2, 2, 16), x64(2, 2, 16)
    cache = mha.KVCache(max_len=max_len)
    m(prefix, cache=cache)
    fork = how(cache)
    forked, kept = [], []
    for t in range(2):  # the two branches step in turn, each after the other wrote
        forked.append(m(a[:, t : t + 1], cache=fork)[0])
        kept.append(m(b[:, t : t + 1], cache=cache)[0])
    assert_close(torch.cat(forked, 1), m(torch.cat([prefix, a], 1))[0][:, 3:])
    assert_close(torch.cat(kept, 1), m(torch.cat([prefix, b], 1))[0][:, 3:])


class Decoder(nn.Module):
    """Hand-written generation code's shape: one KVCache per layer, kept on the model."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([gqa() for _ in range(2)])
        self.caches = [mha.KVCache() for _ in self.layers]

    def forward(self, x):
        for layer, cache in zip(self.layers, self.caches):
            x = x + layer(x, cache=cache)[0]
        return x


def test_a_deepcopied_model_decodes_on_with_its_copied_caches():
    """A deepcopy that copies the owner layers too gives each copied cache to its copied layer (the memo)."""
    model, x = Decoder(), x64(2, 4, 16)
    model(x[:, :3])
    fork = copy.deepcopy(model)
    y = fork(x[:, 3:])
    assert [len(c) for c in fork.caches] == [4, 4] and [len(c) for c in model.caches] == [3, 3]
    model.caches = [mha.KVCache() for _ in model.layers]
    assert_close(y, model(x)[:, 3:])  # the whole sequence at once


@MODES
def test_a_cache_belongs_to_the_layer_that_filled_it_until_reset(max_len):
    first, second, x = gqa(), gqa(), x64(2, 3, 16)
    cache = mha.KVCache(max_len=max_len)
    first(x, cache=cache)
    with pytest.raises(ValueError, match=r"holds the keys of another layer, GroupedQueryAttention\(d_model=16, "
                                         r"h=4, n_kv_heads=2.*each layer needs its own KVCache"):
        second(x[:, :1], cache=cache)  # same shapes: it would append its keys to the first layer's
    assert len(cache) == 3
    cache.reset()
    assert_close(second(x, cache=cache)[0], second(x)[0])


# -- calls that are rerun or raise (C24, C29) -------------------------------------------------------------------


@pytest.mark.c24
@MODES
@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_gradient_checkpointing_a_call_that_fills_a_cache_is_refused_and_the_cache_holds_each_position_once(
        use_reentrant, max_len):
    """C24: the checkpoint's recomputation appended again, len(c) 6 for 3 tokens (or torch's generic
    CheckpointError, and 6 as well): a cache never holds a position twice."""
    m, cache, x = gqa(), mha.KVCache(max_len=max_len), x64(2, 3, 16, requires_grad=True)
    y = checkpoint(lambda x: m(x, cache=cache)[0], x, use_reentrant=use_reentrant)
    refused = r"KVCache step during a backward pass: gradient checkpointing \(torch.utils.checkpoint\) is recomputing"
    with pytest.raises(RuntimeError, match=refused + " a call that filled this KVCache"):
        y.pow(2).sum().backward()
    assert len(cache) == 3
    step = x64(2, 1, 16)
    with torch.no_grad():
        assert_close(m(step, cache=cache)[0], m(torch.cat([x, step], 1))[0][:, 3:])


@pytest.mark.c29
@MODES
def test_a_call_that_raises_leaves_the_cache_as_it_was_and_any_retry_works(max_len):
    """C29: after a first call into KVCache(max_len=8) raised in a hook on out, a batch-1 retry returned batch 4
    (broadcast into the buffers the failed call allocated), and a float64 retry failed deep in torch."""
    m, cache = mha.GroupedQueryAttention(16, 4, 2).eval(), mha.KVCache(max_len=max_len)

    def fail(module, args, out):
        raise MemoryError("out of memory")

    handle = m.out.register_forward_hook(fail)
    with pytest.raises(MemoryError):
        m(torch.randn(4, 3, 16), cache=cache)
    handle.remove()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.k is None
    for retry in (torch.randn(1, 3, 16), x64(2, 3, 16), torch.randn(2, 3, 16, device="meta")):
        m.to(retry.dtype).to(retry.device)
        y, _ = m(retry, cache=cache)
        assert y.shape == retry.shape and len(cache) == 3
        if not retry.is_meta:
            assert_close(y, m(retry)[0], atol=1e-6)
        cache.reset()


@pytest.mark.c29
@MODES
def test_a_beam_reorder_after_a_failed_step_equals_recomputing(max_len):
    """C29's kind: a failed decoding step (a hook on out, out of memory) leaves the rows as they were for reorder."""
    m, prefix, cache = gqa(), x64(3, 4, 16), mha.KVCache(max_len=max_len)
    m(prefix, cache=cache)
    handle = m.out.register_forward_pre_hook(lambda module, args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        m(x64(3, 1, 16), cache=cache)
    handle.remove()
    cache.reorder([1, 1, 0])
    token = x64(3, 1, 16)
    assert_close(m(token, cache=cache)[0], m(torch.cat([prefix[[1, 1, 0]], token], 1))[0][:, 4:])


def fail_on_call(monkeypatch, name, n):
    """Tensor.<name> raises out of memory on its n-th call (the next allocation of a cache, say)."""
    real, calls = getattr(torch.Tensor, name), []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise torch.OutOfMemoryError("simulated")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, name, flaky)


@pytest.mark.c29
def test_out_of_memory_while_a_cache_allocates_leaves_it_empty(monkeypatch):
    """C29's kind: the V buffer's allocation ran out of memory inside the cache's `with` block's entry, where no
    __exit__ runs: the K buffer stayed (for batch 4), and every retry raised a TypeError about None."""
    m, cache = gqa(), mha.KVCache(max_len=8)
    with monkeypatch.context() as patch:
        fail_on_call(patch, "new_empty", 2)
        with pytest.raises(torch.OutOfMemoryError):
            m(x64(4, 3, 16), cache=cache)
    assert len(cache) == 0 and cache.nbytes == 0
    retry = x64(1, 3, 16)
    assert_close(m(retry, cache=cache)[0], m(retry)[0])


@pytest.mark.c29
@MODES
def test_a_reorder_that_runs_out_of_memory_reorders_neither_keys_nor_values(monkeypatch, max_len):
    """C29's kind: a preallocated cache copied its K buffer, then its V buffer; out of memory between the two left
    keys of one beam order and values of another, and the next step was 0.15 off, silently."""
    m, prefix, cache = gqa(), x64(3, 4, 16), mha.KVCache(max_len=max_len)
    m(prefix, cache=cache)
    with monkeypatch.context() as patch:
        fail_on_call(patch, "index_select", 2)
        with pytest.raises(torch.OutOfMemoryError):
            cache.reorder([2, 0, 0])
    token = x64(3, 1, 16)
    assert_close(m(token, cache=cache)[0], m(torch.cat([prefix, token], 1))[0][:, 4:])


@pytest.mark.c10
@pytest.mark.slow
@MODES
@PATHS
def test_a_compiled_fullgraph_decode_loop_equals_the_eager_full_pass(need_weights, max_len):
    """C10: a compiled decode loop (one token a step into a KVCache) broke on lengths that compile made symbolic."""
    torch.compiler.reset()
    m, x = mha.GroupedQueryAttention(16, 4, 2).eval(), torch.randn(2, 8, 16)
    step, cache = torch.compile(m, backend="eager", fullgraph=True), mha.KVCache(max_len=max_len)
    with torch.no_grad():
        ys = [step(x[:, t : t + 1], cache=cache, need_weights=need_weights)[0] for t in range(8)]
        assert_close(torch.cat(ys, 1), m(x)[0], atol=1e-6)
    torch.compiler.reset()
