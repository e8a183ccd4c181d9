"""Tensor-parallel heads (mha.parallel): two processes, gloo, on the CPU.

One run (the ``ranks`` fixture) does every distributed check on both ranks and returns measurements;
the tests below read them. Runs fork this process (milliseconds: torch is already imported) except
one, which spawns fresh interpreters (seconds), the default for functions that live in a module.
"""

import copy
import multiprocessing
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import assert_close

import mha
from mha.parallel import out_columns, qkv_rows, run_on_ranks, shard_heads

N = 2
D_MODEL, H = 16, 4
F64 = torch.float64

# name: (h, n_kv_heads, bias, cross-attention, mask, need_weights)
CONFIGS = {
    "self_causal": (H, None, True, False, None, True),
    "gqa": (H, 2, True, False, None, True),
    "fused_no_weights": (H, 2, True, False, None, False),
    "no_bias": (H, None, False, False, None, True),
    "one_head_per_rank": (2, None, True, False, None, True),
    "cross_padding": (H, None, True, True, "padding", True),
    "per_head_mask": (H, 2, True, False, "per_head", True),
}


def _maxdiff(a, b):
    return (a - b).abs().max().item()


def _mask(kind, B, T, S, h):
    g = torch.Generator().manual_seed(1)
    if kind == "padding":
        keep = torch.ones(B, S, dtype=torch.bool)
        keep[0, -2:] = False
        return keep[:, None, None, :]  # (B, 1, 1, S)
    if kind == "per_head":
        keep = torch.rand(B, h, T, S, generator=g) > 0.3
        keep[..., 0] = True  # no fully blocked row
        return keep
    return None


def _compare(name):
    """Full module vs this rank's shard, forward and backward, in float64."""
    h, g, bias, cross, mask_kind, need_weights = CONFIGS[name]
    torch.manual_seed(0)  # the same weights and inputs on every rank
    full = mha.MultiHeadAttention(D_MODEL, h, n_kv_heads=g, bias=bias, dtype=F64)
    B, T, S = 2, 5, 7 if cross else 5
    x = torch.randn(B, T, D_MODEL, dtype=F64, requires_grad=True)
    context = torch.randn(B, S, D_MODEL, dtype=F64, requires_grad=True) if cross else None
    mask = _mask(mask_kind, B, T, S, h)
    grad_y = torch.randn(B, T, D_MODEL, dtype=F64)

    y, w = full(x, context, mask=mask, need_weights=need_weights)
    (y * grad_y).sum().backward()

    shard = shard_heads(full)
    x2 = x.detach().clone().requires_grad_()
    context2 = None if context is None else context.detach().clone().requires_grad_()
    y2, w2 = shard(x2, context2, mask=mask, need_weights=need_weights)
    (y2 * grad_y).sum().backward()  # every rank computes the same loss

    r = dist.get_rank()
    rows, cols = qkv_rows(full, r, N), out_columns(full, r, N)
    heads = slice(r * h // N, (r + 1) * h // N)
    g = h if g is None else g
    kv_heads = slice(r * g // N, (r + 1) * g // N)
    # The shard's weights, head by head, against W_Q, W_K, W_V and W_O cut out of the full layer
    # by their own shapes (not through qkv_rows): the layout the fused-qkv trap would break.
    d_k = D_MODEL // h
    W_Q, W_K, W_V = full.qkv.weight.detach().split([h * d_k, g * d_k, g * d_k])
    mine_Q, mine_K, mine_V = shard.heads.qkv.weight.detach().split([h // N * d_k, g // N * d_k, g // N * d_k])
    W_O = full.out.weight.detach().view(D_MODEL, h, d_k)  # (d_model, head, d_k): columns per head
    out = {
        "layout": [
            torch.equal(mine_Q.view(-1, d_k, D_MODEL), W_Q.view(h, d_k, D_MODEL)[heads]),
            torch.equal(mine_K.view(-1, d_k, D_MODEL), W_K.view(g, d_k, D_MODEL)[kv_heads]),
            torch.equal(mine_V.view(-1, d_k, D_MODEL), W_V.view(g, d_k, D_MODEL)[kv_heads]),
            torch.equal(shard.heads.out.weight.detach(), W_O[:, heads].reshape(D_MODEL, -1)),
        ],
        "y": _maxdiff(y2, y),
        "x.grad": _maxdiff(x2.grad, x.grad),
        "qkv.weight.grad": _maxdiff(shard.heads.qkv.weight.grad, full.qkv.weight.grad[rows]),
        "out.weight.grad": _maxdiff(shard.heads.out.weight.grad, full.out.weight.grad[:, cols]),
        "w_shape": None if w2 is None else tuple(w2.shape),
        "w": None if w2 is None else _maxdiff(w2, w[:, heads]),
        "heads": (shard.head_ids, shard.kv_head_ids),
    }
    if bias:
        out["qkv.bias.grad"] = _maxdiff(shard.heads.qkv.bias.grad, full.qkv.bias.grad[rows])
        out["out_bias.grad"] = _maxdiff(shard.out_bias.grad, full.out.bias.grad)
    else:
        out["out_bias"] = shard.out_bias
    if cross:
        out["context.grad"] = _maxdiff(context2.grad, context.grad)
    return out


def _decode():
    """Token-by-token decoding: a KVCache per rank (this rank's K/V heads) vs the full module's cache."""
    torch.manual_seed(0)
    full = mha.MultiHeadAttention(D_MODEL, H, n_kv_heads=2, dtype=F64).eval()
    shard = shard_heads(full)
    x = torch.randn(2, 6, D_MODEL, dtype=F64)
    c_full, c_shard, diffs = mha.KVCache(), mha.KVCache(), []
    for t in range(x.size(1)):
        y, _ = full(x[:, t : t + 1], cache=c_full)
        y2, _ = shard(x[:, t : t + 1], cache=c_shard)
        diffs.append(_maxdiff(y2, y))
    return {"max_diff": max(diffs), "cache_shape": tuple(c_shard.k.shape)}


def _colwise_parallel_qkv():
    """What plain ColwiseParallel does to the fused qkv Linear: contiguous row blocks."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    torch.manual_seed(0)
    full = mha.MultiHeadAttention(D_MODEL, H, dtype=F64)
    qkv = parallelize_module(copy.deepcopy(full.qkv), DeviceMesh.from_group(dist.group.WORLD, "cpu"), ColwiseParallel())
    local = qkv.weight.to_local()
    r = dist.get_rank()
    return {
        "is_contiguous_block": torch.equal(local, full.qkv.weight.chunk(N)[r]),
        "is_our_rows": torch.equal(local, full.qkv.weight[qkv_rows(full, r, N)]),
    }


def _errors():
    out = {}
    for name, kwargs in {"h": dict(h=3), "n_kv_heads": dict(h=4, n_kv_heads=1)}.items():
        h = kwargs.pop("h")
        try:
            shard_heads(mha.MultiHeadAttention(12, h, **kwargs))
        except ValueError as err:
            out[name] = str(err)
    shard = shard_heads(mha.MultiHeadAttention(D_MODEL, H))
    try:  # 2 heads in the mask's head dimension: neither 1 nor h = 4
        shard(torch.randn(1, 3, D_MODEL), mask=torch.ones(1, 2, 3, 3, dtype=torch.bool))
    except ValueError as err:
        out["mask"] = str(err)
    return out


def _rng_untouched():
    """Making a shard draws no random numbers: the caller's next torch.randn is unchanged."""
    m = mha.MultiHeadAttention(D_MODEL, H)
    before = torch.get_rng_state()
    shard_heads(m)
    return torch.equal(torch.get_rng_state(), before)


def _on_each_rank():
    out = {name: _compare(name) for name in CONFIGS}
    out["rng_untouched"] = _rng_untouched()
    out["decode"] = _decode()
    out["colwise"] = _colwise_parallel_qkv()
    out["errors"] = _errors()
    out["rank"] = (dist.get_rank(), dist.get_world_size())
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_on_each_rank, world_size=N, start_method="fork")


def test_ranks_come_back_in_order(ranks):
    assert [r["rank"] for r in ranks] == [(0, N), (1, N)]


@pytest.mark.parametrize("name", CONFIGS)
def test_shard_equals_the_full_module(ranks, name):
    h, g, *_ = CONFIGS[name]
    g = h if g is None else g
    for r, res in enumerate(ranks):
        got = res[name]
        for key in ["y", "x.grad", "qkv.weight.grad", "out.weight.grad", "qkv.bias.grad", "out_bias.grad",
                    "context.grad", "w"]:
            if got.get(key) is not None:
                assert got[key] <= 1e-10, (r, key, got[key])
        assert got["heads"] == (range(r * h // N, (r + 1) * h // N), range(r * g // N, (r + 1) * g // N))
        assert got["layout"] == [True] * 4  # its W_Q, W_K, W_V heads and W_O columns
        if CONFIGS[name][5]:
            assert got["w_shape"] == (2, h // N, 5, 7 if CONFIGS[name][3] else 5)
        else:
            assert got["w_shape"] is None
    if not CONFIGS[name][2]:
        assert all(res[name]["out_bias"] is None for res in ranks)


def test_cross_attention_checks_context_grad(ranks):
    assert all("context.grad" in res["cross_padding"] for res in ranks)


def test_sharding_draws_no_random_numbers(ranks):
    assert [res["rng_untouched"] for res in ranks] == [True, True]


def test_decoding_with_a_cache_per_rank(ranks):
    for res in ranks:
        assert res["decode"]["max_diff"] <= 1e-10
        assert res["decode"]["cache_shape"] == (2, 1, 6, D_MODEL // H)  # n_kv_heads / N = 1 K/V head


def test_sharding_errors_name_h_n_kv_heads_and_the_mask_shape(ranks):
    errors = ranks[0]["errors"]
    assert "h=3" in errors["h"] and "N=2" in errors["h"]
    assert "n_kv_heads=1" in errors["n_kv_heads"] and "N=2" in errors["n_kv_heads"]
    assert "h=4" in errors["mask"] and "(1, 2, 3, 3)" in errors["mask"]
    assert ranks[1]["errors"] == errors


def test_plain_colwise_parallel_falls_into_the_fused_qkv_trap(ranks):
    for res in ranks:
        assert res["colwise"] == {"is_contiguous_block": True, "is_our_rows": False}


# -- the fused-qkv trap, without processes: which rows, and what they compute ------------------------------


def _heads_of(rows, m):
    """Name the (part, head) of every d_k-row block in ``rows`` of m.qkv.weight."""
    d_k, widths = m.d_k, [m.h, m.n_kv_heads, m.n_kv_heads]
    names = [(part, i) for part, n in zip("QKV", widths) for i in range(n)]
    blocks = rows.view(-1, d_k)
    assert bool((blocks == blocks[:, :1] + torch.arange(d_k)).all()) and bool((blocks[:, 0] % d_k == 0).all())
    return [names[int(b) // d_k] for b in blocks[:, 0]]


def test_our_rows_give_each_rank_whole_heads():
    m = mha.MultiHeadAttention(D_MODEL, H)
    assert _heads_of(qkv_rows(m, 0, N), m) == [("Q", 0), ("Q", 1), ("K", 0), ("K", 1), ("V", 0), ("V", 1)]
    assert _heads_of(qkv_rows(m, 1, N), m) == [("Q", 2), ("Q", 3), ("K", 2), ("K", 3), ("V", 2), ("V", 3)]
    gqa = mha.MultiHeadAttention(D_MODEL, H, n_kv_heads=2)
    assert _heads_of(qkv_rows(gqa, 1, N), gqa) == [("Q", 2), ("Q", 3), ("K", 1), ("V", 1)]
    assert out_columns(m, 1, N).tolist() == list(range(8, 16))


def test_naive_row_blocks_give_rank_0_all_of_q_and_half_of_k():
    m = mha.MultiHeadAttention(D_MODEL, H)
    naive = torch.arange(m.qkv.weight.size(0)).chunk(N)
    assert _heads_of(naive[0], m) == [("Q", 0), ("Q", 1), ("Q", 2), ("Q", 3), ("K", 0), ("K", 1)]
    assert _heads_of(naive[1], m) == [("K", 2), ("K", 3), ("V", 0), ("V", 1), ("V", 2), ("V", 3)]


def _summed_partial_outputs(m, x, rows_of_rank):
    """Sum over ranks of what each rank computes with the given qkv rows, by hand with F.sdpa."""
    h, g, d_k = m.h // N, m.n_kv_heads // N, m.d_k
    y = m.out.bias.expand(*x.shape[:2], -1)
    for r in range(N):
        rows, cols = rows_of_rank(r), out_columns(m, r, N)
        q, k, v = F.linear(x, m.qkv.weight[rows], m.qkv.bias[rows]).split([h * d_k, g * d_k, g * d_k], dim=-1)
        q, k, v = mha.split_heads(q, h), mha.split_heads(k, g), mha.split_heads(v, g)
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y + F.linear(mha.merge_heads(out), m.out.weight[:, cols])
    return y


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_naive_rows_give_wrong_outputs_and_ours_the_right_ones(n_kv_heads):
    m = mha.MultiHeadAttention(D_MODEL, H, n_kv_heads=n_kv_heads, dtype=F64)
    x = torch.randn(2, 5, D_MODEL, dtype=F64)
    with torch.no_grad():
        y, _ = m(x)
        ours = _summed_partial_outputs(m, x, lambda r: qkv_rows(m, r, N))
        naive = _summed_partial_outputs(m, x, lambda r: torch.arange(m.qkv.weight.size(0)).chunk(N)[r])
    assert_close(ours, y)  # float64: within 1e-10
    assert _maxdiff(naive, y) > 1e-2


# -- errors and the process helper ---------------------------------------------------------------------------


def test_shard_heads_needs_a_multi_head_attention():
    with pytest.raises(TypeError, match="MultiHeadAttention, got Linear"):
        shard_heads(torch.nn.Linear(4, 4))


def test_shard_heads_needs_an_initialised_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        shard_heads(mha.MultiHeadAttention(D_MODEL, H))


def test_qkv_rows_and_out_columns_errors_name_the_numbers():
    with pytest.raises(ValueError, match="h=4 heads across N=3"):
        qkv_rows(mha.MultiHeadAttention(D_MODEL, H), 0, 3)
    with pytest.raises(ValueError, match=r"rank=2 is not in \[0, world_size=2\)"):
        out_columns(mha.MultiHeadAttention(D_MODEL, H), 2, 2)


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("bad input on rank 1")
    dist.barrier()  # waits for rank 1, which never arrives: the parent must stop this rank


def _sleep_on_rank_1():
    if dist.get_rank() == 1:
        time.sleep(60)
    return dist.get_rank()


def test_a_rank_error_is_raised_in_the_parent_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(ValueError, match="bad input on rank 1") as info:
        run_on_ranks(_fail_on_rank_1, start_method="fork", timeout=600)
    # Rank 0, stuck in the barrier, was stopped: not a speed goal, a wait far below the timeout (a loaded CI
    # machine takes seconds to fork and join two ranks).
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


def test_args_reach_every_rank_and_results_come_back_in_rank_order():
    assert run_on_ranks(_shapes, 3, start_method="fork", world_size=3) == [(0, 3, 3), (1, 3, 3), (2, 3, 3)]


def _shapes(n):
    return dist.get_rank(), dist.get_world_size(), n


def _all_reduce_ranks():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.slow
def test_spawn_starts_fresh_interpreters_by_default():
    assert run_on_ranks(_all_reduce_ranks) == [3.0, 3.0]  # 1 + 2, on both ranks


def test_spawn_refuses_functions_it_cannot_import():
    with pytest.raises(ValueError, match="move it into a module or use 'fork'"):
        run_on_ranks(lambda: 0, start_method="spawn")


def _threads_of_the_parent():
    return set(os.listdir(f"/proc/{os.getppid()}/task"))  # thread ids


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_run_on_ranks_starts_no_thread_in_the_parent():
    # A thread running in the parent while a rank is forked can hold a libc lock the rank then waits on forever:
    # a TCPStore served from the parent did, one run in about 200 inside a Jupyter kernel (glibc's resolver lock,
    # taken to name a connecting rank). The ranks now meet through a file, so the parent starts no thread.
    import torch._dynamo  # noqa: F401 -- what run_on_ranks imports before forking, imported before listing
    import torch.distributed.tensor  # noqa: F401

    before = set(os.listdir("/proc/self/task"))
    for during in run_on_ranks(_threads_of_the_parent, start_method="fork"):
        assert during <= before, f"threads started in the parent: {sorted(during - before)}"
