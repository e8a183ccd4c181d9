"""mha.parallel on two gloo ranks (forked): each shard against the unsharded layer, dropout per head (C17), ranks
that disagree, and checkpoints (C30).

One run (the ``ranks`` fixture) does every check that keeps both ranks alive and returns what it measured; the
tests read it. A rank that stops early gets a run of its own.
"""

import copy
import io
import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

import mha
from mha.parallel import full_state_dict, out_columns, qkv_rows, run_on_ranks, shard_heads

N, D_MODEL, H, T = 2, 16, 4, 8
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


def _diff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def _outcome(fn):  # what fn did on this rank: ("ok", result) or (exception type name, message)
    try:
        return "ok", fn()
    except Exception as err:
        return type(err).__name__, str(err)


def _layer(seed=0, h=H, n_kv_heads=None, **kwargs):
    torch.manual_seed(seed)  # the same weights on every rank
    return mha.GroupedQueryAttention(D_MODEL, h, n_kv_heads, **kwargs)


def _mask(kind, B, T, S, h):
    if kind == "padding":
        return mha.padding_mask([S, S - 2])[:, None, None, :]  # (B, 1, 1, S)
    if kind == "per_head":
        keep = torch.rand(B, h, T, S, generator=torch.Generator().manual_seed(1)) > 0.3
        keep[..., 0] = True  # no fully blocked row
        return keep
    return None


def _compare(name):
    """The unsharded layer vs this rank's shard, forward and backward, in float64: {what: max |difference|}."""
    h, g, bias, cross, mask_kind, need_weights = CONFIGS[name]
    full = _layer(h=h, n_kv_heads=g, bias=bias, dtype=F64)
    B, T, S = 2, 5, 7 if cross else 5
    x = torch.randn(B, T, D_MODEL, dtype=F64, requires_grad=True)
    context = torch.randn(B, S, D_MODEL, dtype=F64, requires_grad=True) if cross else None
    mask, grad_y = _mask(mask_kind, B, T, S, h), torch.randn(B, T, D_MODEL, dtype=F64)
    y, w = full(x, context, mask=mask, need_weights=need_weights)
    (y * grad_y).sum().backward()
    shard = shard_heads(full)
    x2, c2 = (None if t is None else t.detach().clone().requires_grad_() for t in (x, context))
    y2, w2 = shard(x2, c2, mask=mask, need_weights=need_weights)
    (y2 * grad_y).sum().backward()  # every rank computes the same loss
    r = dist.get_rank()
    rows, cols, heads = qkv_rows(full, r, N), out_columns(full, r, N), slice(r * h // N, (r + 1) * h // N)
    pairs = {"y": (y2, y), "x.grad": (x2.grad, x.grad),
             "qkv.weight.grad": (shard.heads.qkv.weight.grad, full.qkv.weight.grad[rows]),
             "out.weight.grad": (shard.heads.out.weight.grad, full.out.weight.grad[:, cols])}
    if bias:
        pairs.update({"qkv.bias.grad": (shard.heads.qkv.bias.grad, full.qkv.bias.grad[rows]),
                      "out_bias.grad": (shard.out_bias.grad, full.out.bias.grad)})
    if cross:
        pairs["context.grad"] = (c2.grad, context.grad)
    if need_weights:
        pairs["w"] = (w2, w[:, heads])
    return {key: _diff(*pair) for key, pair in pairs.items()}, (shard.head_ids, shard.kv_head_ids), w2 is None


def _decode_and_colwise():
    """Token by token, a KVCache per rank (this rank's K/V heads) against the unsharded layer's cache; and what plain
    ColwiseParallel does to the fused qkv Linear: contiguous row blocks, not our rows."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    full, r = _layer(n_kv_heads=2, dtype=F64).eval(), dist.get_rank()
    shard, x = shard_heads(full), torch.randn(2, 6, D_MODEL, dtype=F64)
    c_full, c_shard = mha.KVCache(), mha.KVCache()
    gap = max(_diff(shard(x[:, t : t + 1], cache=c_shard)[0], full(x[:, t : t + 1], cache=c_full)[0]) for t in range(6))
    qkv = parallelize_module(copy.deepcopy(full.qkv), DeviceMesh.from_group(dist.group.WORLD, "cpu"), ColwiseParallel())
    local = qkv.weight.to_local()
    return gap, tuple(c_shard.k.shape), (torch.equal(local, full.qkv.weight.chunk(N)[r]),
                                         torch.equal(local, full.qkv.weight[qkv_rows(full, r, N)]))


def _c17():
    """The case as the README puts it: the same seed on every rank, a layer with dropout 0.5, a forward."""
    out = []
    for _ in range(2):  # twice from the same seed: the masks come back the same
        full = _layer(dropout=0.5).train()
        state = torch.get_rng_state()
        shard = shard_heads(full)
        unmoved = torch.equal(torch.get_rng_state(), state)  # making a shard draws no random numbers
        y, w = shard(torch.randn(1, T, D_MODEL))  # w (1, h/N, T, T): this rank's heads' weights after dropout
        dropped = (w[0] == 0) & torch.ones(T, T, dtype=torch.bool).tril()  # a softmax weight is never 0 here
        out.append({"dropped": dropped, "parameters": [p.detach().clone() for p in full.parameters()],
                    "rng_after": torch.get_rng_state(), "y": y.detach(), "unmoved": unmoved})
    return out


def _disagreements():
    r = dist.get_rank()
    out = {
        "weights": _outcome(lambda: shard_heads(_layer(seed=r))),  # each rank seeded differently
        "sizes": _outcome(lambda: shard_heads(_layer(h=4 if r == 0 else 2))),
        "split fails on rank 1": _outcome(lambda: shard_heads(mha.MultiHeadAttention(12, 4 if r == 0 else 3))),
        "mask heads": _outcome(lambda: shard_heads(_layer())(torch.randn(1, 3, D_MODEL),
                                                              mask=torch.ones(1, 2, 3, 3, dtype=torch.bool))),
    }
    shard = shard_heads(_layer())
    torch.manual_seed(1)
    x = torch.randn(2, 5, D_MODEL)
    pad = mha.padding_mask(torch.tensor([5, 3]), 5)[:, None, None, :]  # (B, 1, 1, S)
    cache, other = mha.KVCache(), mha.KVCache()
    if r == 1:
        shard.heads(x[:, :1], cache=other)  # rank 1's cache is one step ahead of rank 0's
    calls = {
        "x values": lambda: shard(x + r),
        "x rows in another order": lambda: shard(x if r == 0 else x.flip(1)),
        "x shape": lambda: shard(x[:, : 5 - r]),
        "mask": lambda: shard(x, mask=pad if r == 0 else None),
        "causal": lambda: shard(x, causal=r == 0),
        "bad x on rank 1": lambda: shard(x if r == 0 else x[..., :8]),
        "not a tensor on rank 1": lambda: shard(x if r == 0 else x.tolist()),
        "cache out of step": lambda: shard(x[:, :1], cache=cache if r == 0 else other),
    }
    for name, call in calls.items():
        out[name] = _outcome(call)
    steps = mha.KVCache()  # decoding: a step the ranks refuse, then its retry
    with torch.no_grad():
        shard(x[:, :2], cache=steps)
        out["refused step"] = _outcome(lambda: shard(x[:, 2:3] + r, cache=steps))
        out["cache after the refused step"] = len(steps)
        out["retried step"] = _diff(shard(x[:, 2:3], cache=steps)[0][:, 0], _layer()(x[:, :3])[0][:, 2])
    # A refused forward in training mode with dropout: every rank still drew its one number.
    dropping = shard_heads(_layer(dropout=0.5).train())
    out["dropout, bad x on rank 1"] = _outcome(lambda: dropping(x if r == 0 else x[..., :8]))
    out["generator after it"] = torch.get_rng_state()
    # Nothing was left half-done: the same shard still computes the full layer's output.
    with torch.no_grad():
        out["after"] = _diff(shard(x, mask=pad)[0], _layer()(x, mask=pad)[0])
    return out


def _through_a_file(state):
    """Every rank's ``state`` as another process reads it: torch.save, then torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    files = [None] * N
    dist.all_gather_object(files, buf.getvalue())
    return [torch.load(io.BytesIO(f), weights_only=True) for f in files]


def _c30_of(g, x):
    r, out = dist.get_rank(), {}
    full = _layer(n_kv_heads=g, dtype=F64)
    shard = shard_heads(full)
    saved = _through_a_file(shard.state_dict())  # rank 0's and rank 1's files
    fresh = shard_heads(_layer(seed=5, n_kv_heads=g, dtype=F64))
    out["own"] = _outcome(lambda: str(fresh.load_state_dict(saved[r])))
    out["own y"] = _diff(fresh(x)[0], full(x)[0])
    out["other rank's"] = _outcome(lambda: fresh.load_state_dict(saved[1 - r]))
    out["whole layer's"] = _outcome(lambda: fresh.load_state_dict(full.state_dict()))
    out["functional_call"] = _diff(torch.func.functional_call(shard, saved[r], (x,), strict=True)[0], full(x)[0])
    whole = _through_a_file(full_state_dict(shard))[0]  # the whole layer, saved from its shards
    unsharded = (mha.MultiHeadAttention(D_MODEL, H, dtype=F64) if g is None
                 else mha.GroupedQueryAttention(D_MODEL, H, g, dtype=F64))
    out["unsharded"] = _outcome(lambda: str(unsharded.load_state_dict(whole)))
    out["unsharded y"] = _diff(unsharded(x)[0], full(x)[0])
    again = shard_heads(unsharded)  # the saved whole layer, sharded again
    out["again"] = [torch.equal(a, b) for a, b in zip(again.state_dict().values(), shard.state_dict().values())]
    return out


def _c30():
    x = torch.randn(2, 5, D_MODEL, dtype=F64)
    out = {g: _c30_of(g, x) for g in (None, 2)}
    # Another layer whose shards have the same shapes: h=2 of d_k=8, and h=4 of d_k=4.
    other = shard_heads(_layer(h=2))
    out["another layer's"] = _outcome(lambda: shard_heads(_layer()).load_state_dict(other.state_dict()))
    return out


def _on_each_rank():
    out = {name: _compare(name) for name in CONFIGS}
    out.update(decode=_decode_and_colwise(), c17=_c17(), disagree=_disagreements(), c30=_c30())
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_on_each_rank, world_size=N, start_method="fork")


@pytest.mark.parametrize("name", CONFIGS)
def test_each_shard_computes_its_heads_and_the_sum_is_the_layer_forward_and_backward(ranks, name):
    h, g, bias, cross, _, need_weights = CONFIGS[name]
    g = g or h
    for r, res in enumerate(ranks):
        diffs, held, no_weights = res[name]
        assert max(diffs.values()) <= 1e-10, (r, diffs)
        assert len(diffs) == 4 + 2 * bias + cross + need_weights and no_weights == (not need_weights)
        assert held == (range(r * h // N, (r + 1) * h // N), range(r * g // N, (r + 1) * g // N))


def test_decoding_with_a_cache_per_rank_and_the_fused_qkv_trap_of_plain_colwise_parallel(ranks):
    for res in ranks:  # n_kv_heads / N = 1 K/V head per rank; ColwiseParallel cuts equal row blocks, not our rows
        assert res["decode"][0] <= 1e-10 and res["decode"][1:] == ((2, 1, 6, D_MODEL // H), (True, False))


def test_C17_each_rank_draws_its_own_dropout_masks_and_the_weights_stay_identical(ranks):
    """Case C17: with one seed on every rank, rank 0's heads (0, 1) and rank 1's (2, 3) drew identical masks."""
    a, b = ranks[0]["c17"][0], ranks[1]["c17"][0]
    n = a["dropped"].numel() // T // T * (T * (T + 1) // 2)  # allowed (query, key) pairs: a 0 there was dropped
    for rank in (a, b):
        assert 0.3 < rank["dropped"].sum().item() / n < 0.7  # p = 0.5
    assert not torch.equal(a["dropped"], b["dropped"])
    assert not torch.equal(a["dropped"][0], a["dropped"][1])  # and two heads of one rank differ
    assert (a["dropped"] != b["dropped"]).sum().item() > n // 4  # about half of the pairs, as for independent masks
    # The weights are the same on every rank, and the default generator moved the same way on both.
    assert all(torch.equal(p, q) for p, q in zip(a["parameters"], b["parameters"]))
    assert torch.equal(a["rng_after"], b["rng_after"]) and torch.equal(a["y"], b["y"])
    for res in ranks:  # the same seed gives the same masks again; sharding itself draws nothing
        assert torch.equal(res["c17"][0]["dropped"], res["c17"][1]["dropped"])
        assert res["c17"][0]["unmoved"]


def test_ranks_holding_different_layers_or_failing_their_own_checks_all_refuse(ranks):
    for r, res in enumerate(ranks):
        kind, message = res["disagree"]["weights"]
        assert kind == "ValueError", (r, kind, message)
        assert "qkv.weight differs between rank 0 and rank(s) [1]" in message
        assert "torch.manual_seed(s) with the same s on every rank" in message
        kind, message = res["disagree"]["sizes"]
        assert kind == "ValueError" and "'h': 4" in message and "rank 1: {" in message and "'h': 2" in message
        kind, message = res["disagree"]["mask heads"]  # 2 heads in the mask's head dimension: neither 1 nor h = 4
        assert kind == "ValueError" and "h=4" in message and "(1, 2, 3, 3)" in message
    kind, message = ranks[1]["disagree"]["split fails on rank 1"]
    assert kind == "ValueError" and "cannot split h=3 heads across N=2" in message
    kind, message = ranks[0]["disagree"]["split fails on rank 1"]
    assert kind == "RuntimeError" and "rank 1 of 2 raised ValueError: cannot split h=3" in message


@pytest.mark.parametrize("name, words", [
    ("x values", "x has the same shape and dtype on every rank but other values on rank(s) [1]"),
    ("x rows in another order", "x has the same shape and dtype on every rank but other values"),
    ("x shape", "x: rank 0: shape (2, 5, 16), torch.float32, rank 1: shape (2, 4, 16), torch.float32"),
    ("mask", "mask: rank 0: shape (2, 1, 1, 5), torch.bool, rank 1: None"),
    ("causal", "causal: rank 0: True, rank 1: False"),
    ("cache out of step", "the cache's length: rank 0: 0, rank 1: 1"),
])
def test_ranks_called_with_different_inputs_all_refuse_and_say_what_differs(ranks, name, words):
    for r, res in enumerate(ranks):
        kind, message = res["disagree"][name]
        assert kind == "ValueError", (r, kind, message)
        assert "different inputs" in message and words in message, message


@pytest.mark.parametrize("name, own", [
    ("bad x on rank 1", "ValueError: x must be (B, T, d_model=16), got shape (2, 5, 8)"),
    ("not a tensor on rank 1", "TypeError: x must be a torch.Tensor"),
    ("dropout, bad x on rank 1", "ValueError: x must be (B, T, d_model=16)"),
])
def test_a_rank_with_bad_input_raises_its_error_and_the_others_name_it(ranks, name, own):
    kind, message = ranks[1]["disagree"][name]
    assert f"{kind}: {message}".startswith(own), (kind, message)
    kind, message = ranks[0]["disagree"][name]
    assert kind == "RuntimeError" and f"rank 1 of 2 raised {own}" in message, message


@pytest.mark.c29
def test_a_step_the_ranks_refuse_leaves_every_ranks_cache_as_it_was(ranks):
    """C29's kind: the ranks compared their inputs after the heads had extended their caches, so a refused step stayed
    in every rank's cache and its retry was 0.20 off the unsharded layer."""
    for res in ranks:
        refused = res["disagree"]
        assert refused["refused step"][0] == "ValueError" and refused["cache after the refused step"] == 2
        assert refused["retried step"] <= 1e-6


def test_after_refusals_the_ranks_stay_in_step_and_the_shard_still_computes_the_layer(ranks):
    assert torch.equal(ranks[0]["disagree"]["generator after it"], ranks[1]["disagree"]["generator after it"])
    assert all(res["disagree"]["after"] <= 1e-6 for res in ranks)


@pytest.mark.parametrize("g", [None, 2])
def test_C30_a_shard_loads_its_own_rank_only_and_the_whole_layer_travels_between_shards(ranks, g):
    """Case C30: a shard's checkpoint saved on rank 0 loaded on every rank without a word, and rank 1 computed
    with heads 0-1 twice."""
    for r, res in enumerate(ranks):
        c30 = res["c30"][g]
        assert c30["own"] == ("ok", "<All keys matched successfully>") and c30["own y"] <= 1e-12
        kind, message = c30["other rank's"]
        assert kind == "ValueError", (r, kind, message)
        assert f"saved by rank {1 - r} of 2 (query heads {2 - 2 * r}..{3 - 2 * r}" in message, message
        assert f"but this shard is rank {r} of 2 (query heads {2 * r}..{2 * r + 1}" in message, message
        assert "shard.state_dict() is per rank" in message and "full_state_dict" in message
        kind, message = c30["whole layer's"]
        assert kind == "ValueError" and "the state_dict of a whole layer, not of a shard" in message
        assert c30["functional_call"] <= 1e-12  # the metadata is no key: functional_call(strict=True) runs
        assert c30["unsharded"] == ("ok", "<All keys matched successfully>") and c30["unsharded y"] <= 1e-12
        assert c30["again"] == [True] * 4
        kind, message = res["c30"]["another layer's"]  # a shard of another layer, of the same shapes
        assert kind == "ValueError" and "a layer with d_model=16, h=2, n_kv_heads=2, d_k=8" in message, message
        assert "a layer with d_model=16, h=4, n_kv_heads=4, d_k=4" in message


def _rank_1_raises_before_the_forward():
    shard = shard_heads(_layer())
    if dist.get_rank() == 1:
        raise KeyError("rank 1's data loader failed")
    return shard(torch.randn(1, 3, D_MODEL))  # rank 0 waits in the forward's all-gather


def test_a_rank_that_never_calls_the_forward_stops_the_run_quickly():
    start = time.monotonic()
    with pytest.raises(KeyError, match="rank 1's data loader failed"):
        run_on_ranks(_rank_1_raises_before_the_forward, start_method="fork", timeout=600)
    assert time.monotonic() - start < 120  # rank 0, waiting in the forward, was stopped: no wait for the timeout
    assert not multiprocessing.active_children()
