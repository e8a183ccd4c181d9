"""A KV cache never holds a position twice, whatever recomputes a call (case C24 and its kind), in float64.

Gradient checkpointing reruns the checkpointed function in the backward pass: an update there is refused, and the
cache keeps what the forward pass stored. A call that raises after its update leaves the cache as it was, so that
retrying it appends its positions once. Each test checks the cache against keys computed without a cache, and the
next decoding steps against one causal call over the whole sequence.
"""

import pytest
import torch
from helpers import assert_close
from torch.utils.checkpoint import checkpoint

import mha

MODES = pytest.mark.parametrize("max_len", [None, 8], ids=["growing", "preallocated"])
REENTRANT = pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
REFUSED = r"KVCache\.update during a backward pass: gradient checkpointing \(torch\.utils\.checkpoint\) is recomputing"


def layer():
    torch.manual_seed(0)
    return mha.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=torch.float64)


def tokens(T, requires_grad=False):
    return torch.randn(2, T, 16, dtype=torch.float64, requires_grad=requires_grad)


def assert_holds_each_position_once(m, cache, x):
    """The cache holds x's keys and values, each once, as m computes them without a cache; a next step with it
    gives what one causal call over x and that step gives."""
    _, k, v = m.project(x)  # (B, S, g*d_k), computed without a cache
    assert len(cache) == x.size(1)
    assert_close(cache.k, mha.split_heads(k, m.n_kv_heads))
    assert_close(cache.v, mha.split_heads(v, m.n_kv_heads))
    nxt = tokens(1)
    with torch.no_grad():
        step, _ = m(nxt, cache=cache)
        whole, _ = m(torch.cat([x, nxt], 1))
    assert_close(step, whole[:, -1:])


@MODES
@REENTRANT
@pytest.mark.parametrize("prefix", [0, 2], ids=["empty", "prefix"])
def test_C24_checkpointing_a_call_that_fills_a_cache_is_refused_and_the_cache_holds_each_position_once(
        use_reentrant, max_len, prefix):
    """The case: before, the recomputation appended again (len 6 for 3 tokens, reentrant), or torch raised a
    generic CheckpointError and the cache held 6 as well (non-reentrant)."""
    m, cache = layer(), mha.KVCache(max_len=max_len)
    before = tokens(prefix)
    if prefix:
        m(before, cache=cache)
    x = tokens(3, requires_grad=True)
    y = checkpoint(lambda x: m(x, cache=cache)[0], x, use_reentrant=use_reentrant)
    assert len(cache) == prefix + 3
    with pytest.raises(RuntimeError, match=REFUSED) as refused:
        y.pow(2).sum().backward()
    assert "would append its 3 new positions a second time" in str(refused.value)
    assert f"({prefix + 3} positions, each once)" in str(refused.value)
    assert_holds_each_position_once(m, cache, torch.cat([before, x.detach()], 1))


@MODES
@pytest.mark.parametrize("error", [RuntimeError("out of memory"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_C24_a_call_that_raises_halfway_leaves_the_cache_as_it_was(max_len, error):
    """A hook on W_O raises after the cache took the new keys: the cache goes back to what it held."""
    m, cache = layer(), mha.KVCache(max_len=max_len)
    before, x = tokens(2), tokens(3)
    m(before, cache=cache)
    nbytes = cache.nbytes

    def fail(module, args):
        raise error

    handle = m.out.register_forward_pre_hook(fail)
    with pytest.raises(type(error)):
        m(x, cache=cache)
    handle.remove()
    assert cache.nbytes == nbytes  # a growing cache keeps no larger tensor alive behind the positions it holds
    assert_holds_each_position_once(m, cache, before)
    empty = mha.KVCache(max_len=max_len)  # the first call raising: empty again, owned by no layer
    handle = m.out.register_forward_pre_hook(fail)
    with pytest.raises(type(error)):
        m(x, cache=empty)
    handle.remove()
    assert len(empty) == 0 and empty.k is None  # (a preallocated one has allocated its buffers)
    mha.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=torch.float64)(x, cache=empty)  # any layer may take it now


@MODES
def test_C24_a_retried_decoding_step_holds_its_token_once(max_len):
    """A generation loop whose third step fails once (out of memory, say) and is retried: the tokens it generates
    are those of one causal call over the whole sequence."""
    m, cache = layer(), mha.KVCache(max_len=max_len)
    x = tokens(6)
    fail_at = 2  # the step that fails, once

    def fail_once(module, args):
        nonlocal fail_at
        if step == fail_at:
            fail_at = None
            raise RuntimeError("out of memory")

    m.out.register_forward_pre_hook(fail_once)
    outputs, retries = [], 0
    for step in range(6):
        while True:
            try:
                outputs.append(m(x[:, step : step + 1], cache=cache)[0])
                break
            except RuntimeError:
                retries += 1
    assert retries == 1 and len(cache) == 6
    assert_close(torch.cat(outputs, 1), m(x)[0])


@MODES
@REENTRANT
def test_C24_a_cache_filled_under_inference_mode_then_checkpointed_is_refused_the_same_way(use_reentrant, max_len):
    """The neighbour "inference mode": a prompt cached under torch.inference_mode(), then a checkpointed step."""
    m, cache = layer(), mha.KVCache(max_len=max_len)
    prompt, x = tokens(2), tokens(3, requires_grad=True)
    with torch.inference_mode():
        m(prompt, cache=cache)
    y = checkpoint(lambda x: m(x, cache=cache)[0], x, use_reentrant=use_reentrant)
    with pytest.raises(RuntimeError, match=REFUSED):
        y.pow(2).sum().backward()
    assert_holds_each_position_once(m, cache, torch.cat([prompt, x.detach()], 1))


@pytest.mark.slow
@REENTRANT
@pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])
def test_C24_a_compiled_training_step_with_gradient_checkpointing_has_the_uncheckpointed_gradients(
        need_weights, use_reentrant, graphs):
    """The neighbour "compile": torch.compile of a training step whose layer call is checkpointed (no cache)."""
    m, x = layer(), tokens(3, requires_grad=True)

    def step(x):
        return checkpoint(lambda x: m(x, need_weights=need_weights)[0], x, use_reentrant=use_reentrant).pow(2).sum()

    loss = torch.compile(step, backend=graphs)(x)
    compiled = torch.autograd.grad(loss, [x, *m.parameters()])
    assert graphs.count >= 1  # it really compiled
    eager = torch.autograd.grad(m(x, need_weights=need_weights)[0].pow(2).sum(), [x, *m.parameters()])
    for c, e in zip(compiled, eager):
        assert_close(c, e)


@pytest.mark.slow
@REENTRANT
def test_C24_a_compiled_step_checkpointing_a_cached_call_is_refused_as_in_eager(use_reentrant):
    """Dynamo cannot put a cache update inside a checkpoint's graph (fullgraph=True says "Unsafe side effect"), so
    it runs the checkpoint eagerly, and the backward pass's recomputation is refused as in eager."""
    torch.compiler.reset()
    m, cache = layer(), mha.KVCache()
    prompt, x = tokens(2), tokens(3, requires_grad=True)
    m(prompt, cache=cache)

    def step(x):
        return checkpoint(lambda x: m(x, cache=cache)[0], x, use_reentrant=use_reentrant).pow(2).sum()

    loss = torch.compile(step, backend="aot_eager")(x)
    with pytest.raises(RuntimeError, match=REFUSED):
        loss.backward()
    assert_holds_each_position_once(m, cache, torch.cat([prompt, x.detach()], 1))
    torch.compiler.reset()
