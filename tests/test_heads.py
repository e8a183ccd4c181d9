"""The reshapes that make heads (mha/heads.py), against their definitions: a head is a d_k-wide slice of the
projected vector, and merging lays the heads' outputs side by side at each time step."""

import pytest
import torch
from helpers import assert_close

import mha

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.c6
def test_merge_lays_each_time_steps_heads_side_by_side_and_split_undoes_it():
    """C6: reshape (B, h, T, d_k) -> (B, T, h*d_k) without the transpose runs, and mixes heads with time steps."""
    out = torch.randn(2, 4, 5, 3)  # (B, h, T, d_k)
    merged = mha.merge_heads(out)
    expected = torch.stack([torch.cat([out[:, i, t] for i in range(4)], -1) for t in range(5)], 1)
    assert torch.equal(merged, expected)
    assert torch.equal(mha.split_heads(merged, 4), out)


@pytest.mark.c23
def test_project_runs_the_layers_qkv_as_a_module_and_takes_keys_from_the_context():
    """C23's kind: what wraps qkv (here a hook) acts wherever a layer's projections are computed."""
    m = mha.GroupedQueryAttention(16, 4, 2, dtype=torch.float64)
    seen = []
    m.qkv.register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    x, context = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    q, k, v = mha.project(m, x, context)
    assert seen == [(2, 3, 16), (2, 5, 16)]
    W_Q, W_K, W_V = m.qkv.weight.split([16, 8, 8])
    b_Q, b_K, b_V = m.qkv.bias.split([16, 8, 8])
    assert_close(q, x @ W_Q.T + b_Q)
    assert_close(k, context @ W_K.T + b_K)
    assert_close(v, context @ W_V.T + b_V)
