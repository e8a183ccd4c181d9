"""mha.parallel in one process: from_heads against F.scaled_dot_product_attention, the rows each rank holds (and the
fused-qkv trap), and run_on_ranks. What needs two ranks is in tests/test_parallel_ranks.py."""

import multiprocessing
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import assert_close

import mha
from mha.parallel import from_heads, out_columns, qkv_rows, run_on_ranks, shard_heads

F64 = torch.float64


def layer(h=4, n_kv_heads=None, bias=True, **kwargs):
    return mha.GroupedQueryAttention(16, h, n_kv_heads, bias=bias, dtype=F64, **kwargs).eval()


def sdpa_heads(m, x, keep, rows, cols):
    """The share of y of the heads whose qkv rows and W_O columns are given, by F.scaled_dot_product_attention."""
    d_k = m.d_k
    h, g = len(cols) // d_k, (len(rows) - len(cols)) // (2 * d_k)
    bias = None if m.qkv.bias is None else m.qkv.bias[rows]
    q, k, v = F.linear(x, m.qkv.weight[rows], bias).split([h * d_k, g * d_k, g * d_k], dim=-1)
    q, k, v = mha.split_heads(q, h), mha.split_heads(k, g), mha.split_heads(v, g)
    k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep & mha.causal_mask(x.size(1)))
    return F.linear(mha.merge_heads(out), m.out.weight[:, cols])


# -- from_heads: a layer of some of a layer's heads --------------------------------------------------------------

PARTITIONS = [  # (h, n_kv_heads, a partition of the query heads)
    (4, None, [range(4)]),  # all heads: the layer itself
    (4, None, [[3], [0, 2], [1]]),  # any order, any sizes: one K/V head per query head
    (4, 2, [[0], [1], [2], [3]]),  # one query head and its K/V head each
    (8, 2, [[4, 5, 6, 7], [1, 0, 2, 3]]),  # within a K/V head's group, any order
    (4, 2, [[0, 2], [1, 3]]),  # heads of two K/V heads, one each: both K/V heads go into both parts
    (4, 1, [[0, 1], [2, 3]]),  # multi-query: the one K/V head goes to every part
    (4, None, [[0, 1, 2], [3]]),  # 3 heads of d_k 4 in a 16-wide layer: an explicit d_k, 3 not dividing 16
]


@pytest.mark.parametrize("h, n_kv_heads, parts", PARTITIONS)
@pytest.mark.parametrize("need_weights", [True, False])
def test_partial_outputs_sum_to_the_full_layer(h, n_kv_heads, parts, need_weights):
    m = layer(h=h, n_kv_heads=n_kv_heads)
    x = torch.randn(2, 6, 16, dtype=F64)
    keep = mha.padding_mask([6, 3])[:, None, None, :]
    y, w = m(x, mask=keep, need_weights=need_weights)
    total = m.out.bias.clone()
    for heads in parts:
        part = from_heads(m, heads, out_bias=False)
        assert isinstance(part, mha.GroupedQueryAttention) and part.out.bias is None and part.h == len(heads)
        y_part, w_part = part(x, mask=keep, need_weights=need_weights)
        total = total + y_part
        if need_weights:  # its head i is the layer's head heads[i]
            assert_close(w_part, w[:, list(heads)])
    assert_close(total, y)


def test_from_heads_keeps_dtype_dropout_training_and_frozen_parameters_and_draws_no_random_numbers():
    m = mha.GroupedQueryAttention(16, 4, 2, dropout=0.25, dtype=F64).train()
    m.qkv.weight.requires_grad_(False)
    state = torch.get_rng_state()
    part = from_heads(m, range(2, 4))
    assert torch.equal(torch.get_rng_state(), state)
    assert (part.h, part.n_kv_heads, part.d_k, part.d_model, part.dropout) == (2, 1, 4, 16, 0.25)
    assert part.training and part.qkv.weight.dtype == F64 and part.qkv.weight.device == m.qkv.weight.device
    assert [p.requires_grad for p in part.parameters()] == [False, True, True, True]
    assert torch.equal(part.out.bias, m.out.bias) and part.out.bias.data_ptr() != m.out.bias.data_ptr()  # a copy
    assert torch.equal(part.out.weight, m.out.weight[:, 8:])
    meta = from_heads(mha.MultiHeadAttention(64, 8, device="meta"), [0])
    assert meta.qkv.weight.device.type == "meta" and meta.qkv.weight.shape == (24, 64)


def _hooked():  # case C23's kind
    m = layer()
    m.qkv.register_forward_hook(lambda *args: None)  # a hook (pruning, an adapter) that copying the weights would lose
    return m


@pytest.mark.parametrize("call, error, message", [
    (lambda: from_heads(layer(), []), ValueError, r"at least one head"),
    (lambda: from_heads(layer(), [0, 0]), ValueError, r"distinct indices in \[0, h=4\), got \[0, 0\]"),
    (lambda: from_heads(layer(), [4]), ValueError, r"distinct indices in \[0, h=4\), got \[4\]"),
    (lambda: from_heads(layer(), [-1]), ValueError, r"got \[-1\]"),
    (lambda: from_heads(layer(), [0.0]), TypeError, r"head indices must be ints, got 0.0"),
    (lambda: from_heads(layer(), [True]), TypeError, r"head indices must be ints, got True"),
    (lambda: from_heads(layer(), 2), TypeError, r"heads must be a range or sequence of query-head indices, got int 2"),
    (lambda: from_heads(layer(n_kv_heads=2), [0, 1, 2]), ValueError, r"heads \[0, 1, 2\] use K/V heads \[0, 0, 1\]"),
    (lambda: from_heads(layer(n_kv_heads=2), [0, 2, 1, 3]), ValueError, r"use K/V heads \[0, 1, 0, 1\]"),  # apart
    (lambda: from_heads(torch.nn.MultiheadAttention(16, 4), [0]), TypeError, r"needs an mha.MultiHeadAttention"),
    (lambda: from_heads(_hooked(), [0]), ValueError, r"from_heads copies the weights of qkv .* has forward hooks"),
    (lambda: qkv_rows(layer(), 0, 3), ValueError, "h=4 heads across N=3"),
    (lambda: qkv_rows(layer(n_kv_heads=2), 0, 4), ValueError, r"n_kv_heads=2 K/V heads across N=4 .*\(N in \[1, 2\]\)"),
    (lambda: out_columns(layer(), 2, 2), ValueError, r"rank=2 is not in \[0, world_size=2\)"),
    (lambda: shard_heads(torch.nn.Linear(4, 4)), TypeError, "MultiHeadAttention, got Linear"),
    (lambda: shard_heads(layer()), RuntimeError, "init_process_group"),  # no process group in this process
    (lambda: mha.parallel.full_state_dict(layer()), TypeError, "full_state_dict needs a ShardedMultiHeadAttention"),
])
def test_heads_that_make_no_layer_impossible_splits_and_unsharded_calls_are_refused_naming_why(call, error, message):
    with pytest.raises(error, match=message):
        call()


# -- which rows each rank holds, and the fused-qkv trap ------------------------------------------------------------


def _heads_of(rows, m):
    """Name the (part, head) of every d_k-row block in ``rows`` of m.qkv.weight."""
    d_k, g = m.d_k, getattr(m, "n_kv_heads", m.h)
    names = [(part, i) for part, n in zip("QKV", (m.h, g, g)) for i in range(n)]
    blocks = rows.view(-1, d_k)
    assert bool((blocks == blocks[:, :1] + torch.arange(d_k)).all()) and bool((blocks[:, 0] % d_k == 0).all())
    return [names[int(b) // d_k] for b in blocks[:, 0]]


def test_our_rows_give_each_rank_whole_heads_where_equal_row_blocks_do_not():
    m = mha.MultiHeadAttention(16, 4)
    assert _heads_of(qkv_rows(m, 0, 2), m) == [("Q", 0), ("Q", 1), ("K", 0), ("K", 1), ("V", 0), ("V", 1)]
    assert _heads_of(qkv_rows(m, 1, 2), m) == [("Q", 2), ("Q", 3), ("K", 2), ("K", 3), ("V", 2), ("V", 3)]
    gqa = mha.GroupedQueryAttention(16, 4, 2)
    assert _heads_of(qkv_rows(gqa, 1, 2), gqa) == [("Q", 2), ("Q", 3), ("K", 1), ("V", 1)]
    assert out_columns(m, 1, 2).tolist() == list(range(8, 16))
    naive = torch.arange(m.qkv.weight.size(0)).chunk(2)  # what ColwiseParallel cuts (checked on ranks)
    assert _heads_of(naive[0], m) == [("Q", 0), ("Q", 1), ("Q", 2), ("Q", 3), ("K", 0), ("K", 1)]


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_our_rows_sum_to_the_layer_and_equal_row_blocks_to_something_else(n_kv_heads):
    m = layer(n_kv_heads=n_kv_heads)
    x = torch.randn(2, 5, 16, dtype=F64)
    keep = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    with torch.no_grad():
        y, _ = m(x)
        ours = sum(sdpa_heads(m, x, keep, qkv_rows(m, r, 2), out_columns(m, r, 2)) for r in range(2)) + m.out.bias
        naive = sum(sdpa_heads(m, x, keep, torch.arange(m.qkv.weight.size(0)).chunk(2)[r], out_columns(m, r, 2))
                    for r in range(2)) + m.out.bias
    assert_close(ours, y)
    assert (naive - y).abs().max() > 1e-2


# -- run_on_ranks ------------------------------------------------------------------------------------------------


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("bad input on rank 1")
    dist.barrier()  # waits for rank 1, which never arrives: the parent must stop this rank


def _sleep_on_rank_1():
    if dist.get_rank() == 1:
        time.sleep(60)
    return dist.get_rank()


def _all_reduce_ranks():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def _threads_of_the_parent(n):
    return dist.get_rank(), dist.get_world_size(), n, set(os.listdir(f"/proc/{os.getppid()}/task"))  # thread ids


def test_a_rank_error_is_raised_in_the_parent_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(ValueError, match="bad input on rank 1") as info:
        run_on_ranks(_fail_on_rank_1, start_method="fork", timeout=600)
    # Rank 0, stuck in the barrier, was stopped: not a speed goal, a wait far below the timeout.
    assert time.monotonic() - start < 120
    cause = str(info.value.__cause__)
    assert "rank 1 of 2 raised" in cause and "_fail_on_rank_1" in cause
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_a_hung_rank_times_out_and_is_stopped():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 did not finish within timeout=1"):
        run_on_ranks(_sleep_on_rank_1, start_method="fork", timeout=1)
    assert time.monotonic() - start < 55  # rank 1's 60 s sleep was cut short
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_spawn_starts_fresh_interpreters_by_default():
    assert run_on_ranks(_all_reduce_ranks) == [3.0, 3.0]  # 1 + 2, on both ranks


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(start_method="spawn"), ValueError, "move it into a module or use 'fork'"),
    (dict(world_size=0), ValueError, "world_size must be positive, got 0"),
    (dict(world_size=True), TypeError, "world_size must be an int, got True"),
    (dict(world_size=2.0), TypeError, "world_size must be an int, got 2.0"),
    (dict(timeout=0), ValueError, "timeout must be a positive number of seconds, got 0"),
])
def test_run_on_ranks_checks_its_arguments_before_starting_a_process(kwargs, error, message):
    """Case C32's kind: a world size or timeout outside what works is named at the door, with what to pass."""
    with pytest.raises(error, match=message):
        run_on_ranks(lambda: 0, **kwargs)
    assert not multiprocessing.active_children()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_args_reach_every_rank_results_come_back_in_rank_order_and_no_thread_starts_in_the_parent():
    # A thread running in the parent while a rank is forked can hold a libc lock the rank then waits on forever:
    # a TCPStore served from the parent did, one run in about 200 inside a Jupyter kernel. The ranks meet through
    # a file. What run_on_ranks loads before forking is loaded before listing.
    import torch.distributed.tensor  # noqa: F401

    torch.compiler.disable(lambda: None)
    before = set(os.listdir("/proc/self/task"))
    results = run_on_ranks(_threads_of_the_parent, 3, start_method="fork", world_size=3)
    assert [r[:3] for r in results] == [(0, 3, 3), (1, 3, 3), (2, 3, 3)]
    for *_, during in results:
        assert during <= before, f"threads started in the parent: {sorted(during - before)}"
