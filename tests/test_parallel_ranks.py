"""Tensor-parallel ranks that do not act as one (issue 17, case C17): dropout, and ranks that disagree.

Two gloo processes (forked), one run for every check that keeps both ranks alive; the tests read its
measurements. A rank that stops early gets runs of its own.
"""

import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

import mha
from mha.parallel import run_on_ranks, shard_heads

N, D_MODEL, H, T = 2, 16, 4, 8


def _outcome(fn):
    """What fn did on this rank: ("ok", result) or (exception type name, message)."""
    try:
        return "ok", fn()
    except Exception as err:
        return type(err).__name__, str(err)


def _c17():
    """The case as the README puts it: the same seed on every rank, a layer with dropout 0.5, a forward."""
    out = {}
    for attempt in range(2):  # twice from the same seed: the masks come back the same
        torch.manual_seed(0)
        full = mha.MultiHeadAttention(D_MODEL, H, dropout=0.5).train()
        shard = shard_heads(full)
        x = torch.randn(1, T, D_MODEL)
        y, w = shard(x)  # w (1, h/N, T, T): this rank's heads' weights after dropout
        out[attempt] = {
            "dropped": (w[0] == 0) & torch.ones(T, T, dtype=torch.bool).tril(),  # a softmax weight is never 0 here
            "parameters": [p.detach().clone() for p in full.parameters()],
            "rng_after": torch.get_rng_state(),
            "y": y.detach(),
        }
    return out


def _layer(seed=0, h=H, **kwargs):
    torch.manual_seed(seed)
    return mha.MultiHeadAttention(D_MODEL, h, **kwargs)


def _disagreements():
    r = dist.get_rank()
    out = {
        "weights": _outcome(lambda: shard_heads(_layer(seed=r))),  # each rank seeded differently
        "sizes": _outcome(lambda: shard_heads(_layer(h=4 if r == 0 else 2))),
        "split fails on rank 1": _outcome(lambda: shard_heads(mha.MultiHeadAttention(12, 4 if r == 0 else 3))),
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
    # A refused forward in training mode with dropout: every rank still drew its one number.
    dropping = shard_heads(_layer(dropout=0.5).train())
    out["dropout, bad x on rank 1"] = _outcome(lambda: dropping(x if r == 0 else x[..., :8]))
    out["generator after it"] = torch.get_rng_state()
    # Nothing was left half-done: the same shard still computes the full layer's output.
    with torch.no_grad():
        out["after"] = (shard(x, mask=pad)[0] - _layer()(x, mask=pad)[0]).abs().max().item()
    return out


def _on_each_rank():
    return {"c17": _c17(), "disagree": _disagreements()}


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_on_each_rank, world_size=N, start_method="fork")


def test_C17_each_rank_draws_its_own_dropout_masks_and_the_weights_stay_identical(ranks):
    a, b = ranks[0]["c17"][0], ranks[1]["c17"][0]
    # Every allowed (query, key) pair of every head has a weight > 0, so a 0 is a dropped weight.
    n = a["dropped"].numel() // T // T * (T * (T + 1) // 2)
    for rank in (a, b):
        rate = rank["dropped"].sum().item() / n
        assert 0.3 < rate < 0.7, rate  # p = 0.5
    assert not torch.equal(a["dropped"], b["dropped"])  # rank 0's heads (0, 1) and rank 1's (2, 3) differ
    assert not torch.equal(a["dropped"][0], a["dropped"][1])  # and so do two heads of one rank
    differ = (a["dropped"] != b["dropped"]).sum().item()
    assert differ > n // 4, differ  # about half of the pairs, as for independent masks
    # The weights are the same on every rank, and the default generator moved the same way on both.
    assert all(torch.equal(p, q) for p, q in zip(a["parameters"], b["parameters"]))
    assert torch.equal(a["rng_after"], b["rng_after"])
    assert torch.equal(a["y"], b["y"])  # one all-reduce: the same output on every rank


def test_C17_the_same_seed_gives_the_same_masks(ranks):
    for res in ranks:
        assert torch.equal(res["c17"][0]["dropped"], res["c17"][1]["dropped"])


def test_ranks_with_different_weights_are_refused_on_every_rank(ranks):
    for r, res in enumerate(ranks):
        kind, message = res["disagree"]["weights"]
        assert kind == "ValueError", (r, kind, message)
        assert "qkv.weight differs between rank 0 and rank(s) [1]" in message
        assert "torch.manual_seed(s) with the same s on every rank" in message


def test_ranks_with_different_sizes_are_refused_and_named(ranks):
    for res in ranks:
        kind, message = res["disagree"]["sizes"]
        assert kind == "ValueError" and "'h': 4" in message and "rank 1: {" in message and "'h': 2" in message


def test_a_rank_whose_own_checks_fail_makes_every_rank_raise(ranks):
    kind, message = ranks[1]["disagree"]["split fails on rank 1"]
    assert kind == "ValueError" and "cannot split h=3 heads across N=2" in message
    kind, message = ranks[0]["disagree"]["split fails on rank 1"]
    assert kind == "RuntimeError" and "rank 1 of 2 raised ValueError: cannot split h=3" in message


@pytest.mark.parametrize(
    "name, words",
    [
        ("x values", "x has the same shape and dtype on every rank but other values on rank(s) [1]"),
        ("x rows in another order", "x has the same shape and dtype on every rank but other values"),
        ("x shape", "x: rank 0: shape (2, 5, 16), torch.float32, rank 1: shape (2, 4, 16), torch.float32"),
        ("mask", "mask: rank 0: shape (2, 1, 1, 5), torch.bool, rank 1: None"),
        ("causal", "causal: rank 0: True, rank 1: False"),
        ("cache out of step", "the cache's length: rank 0: 0, rank 1: 1"),
    ],
)
def test_ranks_called_with_different_inputs_all_refuse_and_say_what_differs(ranks, name, words):
    for r, res in enumerate(ranks):
        kind, message = res["disagree"][name]
        assert kind == "ValueError", (r, kind, message)
        assert "different inputs" in message and words in message, message


@pytest.mark.parametrize(
    "name, own",
    [
        ("bad x on rank 1", "ValueError: x must be (B, T, d_model=16), got shape (2, 5, 8)"),
        ("not a tensor on rank 1", "TypeError: x must be a torch.Tensor"),
    ],
)
def test_a_rank_with_bad_input_raises_its_error_and_the_others_name_it(ranks, name, own):
    kind, message = ranks[1]["disagree"][name]
    assert f"{kind}: {message}".startswith(own), (kind, message)
    kind, message = ranks[0]["disagree"][name]
    assert kind == "RuntimeError" and f"rank 1 of 2 raised {own}" in message, message


def test_a_refused_forward_with_dropout_leaves_the_ranks_generators_in_step(ranks):
    assert [res["disagree"]["dropout, bad x on rank 1"][0] for res in ranks] == ["RuntimeError", "ValueError"]
    assert torch.equal(ranks[0]["disagree"]["generator after it"], ranks[1]["disagree"]["generator after it"])


def test_after_refusals_the_shard_still_computes_the_full_layer(ranks):
    assert all(res["disagree"]["after"] <= 1e-6 for res in ranks)


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
