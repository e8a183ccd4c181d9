"""Causality, batch independence, padding, determinism and dropout (issue 3)."""

import pytest
import torch
from helpers import assert_close

import mha

PATHS = {  # name -> how to run a (B, T, d_model) batch through the module
    "explicit": lambda m, x, **kw: m(x, **kw)[0],
    "fused": lambda m, x, **kw: m(x, need_weights=False, **kw)[0],
}


def incremental(m, x, chunk=1, need_weights=False):
    cache = mha.KVCache()
    outs = [m(x[:, i : i + chunk], cache=cache, need_weights=need_weights)[0] for i in range(0, x.size(1), chunk)]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("path", ["explicit", "fused", "cache", "cache-chunks"])
def test_causality_later_tokens_never_change_earlier_outputs(path, n_kv_heads):
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads).eval()
    run = {
        "explicit": PATHS["explicit"], "fused": PATHS["fused"],
        "cache": lambda m, x: incremental(m, x), "cache-chunks": lambda m, x: incremental(m, x, chunk=3),
    }[path]
    x = torch.randn(2, 7, 16)
    y = run(m, x)
    for t in range(7):
        x2 = x.clone()
        x2[:, t:] = torch.randn(2, 7 - t, 16)
        assert torch.equal(run(m, x2)[:, :t], y[:, :t]), f"position < {t} changed"


@pytest.mark.parametrize("path", PATHS)
def test_causality_with_padding_mask(path):
    m = mha.MultiHeadAttention(16, 4)
    keep = mha.padding_mask([7, 5], 7)[:, None, None, :]
    x = torch.randn(2, 7, 16)
    y = PATHS[path](m, x, mask=keep)
    x2 = x.clone()
    x2[:, 3:] = 0
    assert torch.equal(PATHS[path](m, x2, mask=keep)[:, :3], y[:, :3])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [True, False])
def test_changing_one_sample_changes_only_its_outputs(path, causal):
    m = mha.MultiHeadAttention(16, 4)
    x = torch.randn(4, 5, 16)
    y = PATHS[path](m, x, causal=causal)
    x2 = x.clone()
    x2[2] = torch.randn(5, 16) * 100
    y2 = PATHS[path](m, x2, causal=causal)
    changed = [b for b in range(4) if not torch.allclose(y[b], y2[b], rtol=0, atol=1e-6)]
    assert changed == [2]


def test_changing_one_samples_context_changes_only_its_outputs():
    m = mha.MultiHeadAttention(16, 4)
    x, c = torch.randn(3, 4, 16), torch.randn(3, 6, 16)
    y, _ = m(x, c)
    c2 = c.clone()
    c2[0] += 1
    y2, _ = m(x, c2)
    assert_close(y2[1:], y[1:], atol=1e-6)
    assert not torch.allclose(y2[0], y[0])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [True, False])
def test_padded_sample_equals_running_it_alone(path, causal):
    m = mha.MultiHeadAttention(16, 4).double()
    lengths = [6, 3, 1]
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    keep = mha.padding_mask(lengths, 6)[:, None, None, :]
    y = PATHS[path](m, x, mask=keep, causal=causal)
    for b, n in enumerate(lengths):
        alone = PATHS[path](m, x[b : b + 1, :n], causal=causal)
        assert_close(y[b : b + 1, :n], alone, atol=1e-12)


def test_padding_gets_no_weight():
    m = mha.MultiHeadAttention(16, 4)
    keep = mha.padding_mask([4, 2], 4)[:, None, None, :]
    _, w = m(torch.randn(2, 4, 16), mask=keep, causal=False)
    assert torch.equal(w[1, :, :, 2:], torch.zeros(4, 4, 2))


@pytest.mark.parametrize("path", PATHS)
def test_eval_is_bit_identical_with_dropout(path):
    m = mha.MultiHeadAttention(16, 4, dropout=0.5).eval()
    x = torch.randn(2, 5, 16)
    assert torch.equal(PATHS[path](m, x), PATHS[path](m, x))


def test_train_mode_honours_dropout_rate():
    p = 0.3
    m = mha.MultiHeadAttention(32, 4, dropout=p).train()
    _, w_train = m(torch.randn(8, 64, 32), causal=False)
    m.eval()
    dropped = (w_train == 0).float().mean().item()
    assert abs(dropped - p) < 0.02, dropped
    # Kept weights are scaled by 1/(1-p), so each row sums to 1/(1-p) on average.
    assert abs(w_train.sum(-1).mean().item() - 1.0) < 0.02


@pytest.mark.slow
def test_fused_path_applies_dropout_in_training_only():
    m = mha.MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 5, 16)
    m.train()
    a, b = m(x, need_weights=False)[0], m(x, need_weights=False)[0]
    assert not torch.equal(a, b)
    m.eval()
    y_eval = m(x, need_weights=False)[0]
    m.train()
    mean = torch.stack([m(x, need_weights=False)[0] for _ in range(400)]).mean(0)
    assert_close(mean, y_eval, atol=0.15)  # dropout keeps the expectation
