"""The layer where PyTorch code goes: torch.compile, torch.export and torch.jit.trace (issue 12, case C10).

The compiled layer and the compiled decoding loop of case C10 itself are tests/test_cases.py's test_C10_*.

Each recorded graph is run at lengths other than the one it was recorded at, and compared with eager.
Most tests compile with a counting backend that runs the graph as captured (like backend="eager"):
capturing is where symbolic lengths bite, and it is cheap. One test runs inductor, on the fused path only
(about 6-10 s cold on 2 cores; the explicit path costs about 35 s and dynamic shapes about 60 s).
"""

import shutil

import pytest
import torch
from helpers import assert_close
from torch import nn
from torch.export import Dim, export

import mha

# torch.compile and torch.export take up to seconds a test (inductor the most): the fast tier leaves this file out.
pytestmark = pytest.mark.slow


class Layer(nn.Module):
    """Tensors in, tensors out, as torch.export and torch.jit.trace want: x and an optional keep-mask."""

    def __init__(self, m, need_weights, causal=True):
        super().__init__()
        self.m, self.need_weights, self.causal = m, need_weights, causal

    def forward(self, x, keep=None):
        y, w = self.m(x, mask=keep, causal=self.causal, need_weights=self.need_weights)
        return (y,) if w is None else (y, w)


def inputs(T, masked):
    x = torch.randn(2, T, 16)
    keep = mha.padding_mask([T, max(T - 2, 1)], T)[:, None, None, :]  # (B, 1, 1, S)
    return (x, keep) if masked else (x,)


def assert_all_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_close(a, e, atol=1e-6)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_export_with_a_dynamic_length_runs_at_other_lengths(need_weights, masked):
    layer = Layer(mha.MultiHeadAttention(16, 4, n_kv_heads=2).eval(), need_weights)
    T = Dim("T", min=1, max=64)
    shapes = {"x": {1: T}, "keep": {3: T}} if masked else {"x": {1: T}}
    program = export(layer, inputs(7, masked), dynamic_shapes=shapes)
    for length in (1, 3, 12):
        args = inputs(length, masked)
        assert_all_close(program.module()(*args), layer(*args))


@pytest.mark.parametrize("need_weights", [True, False])
def test_compile_dynamic_serves_every_size_from_2_and_specialises_1(need_weights, graphs):
    # docs/compatibility.md: one graph for every B, T >= 2; T = 1 and B = 1 (sizes dynamo specialises) add one each.
    m = mha.MultiHeadAttention(16, 4).eval()
    f = torch.compile(m, backend=graphs, fullgraph=True, dynamic=True)
    counts = []
    for B, T in ((2, 7), (3, 11), (2, 1), (4, 1), (1, 5), (1, 9), (1, 1), (5, 6)):
        x = torch.randn(B, T, 16)
        assert_all_close([f(x, need_weights=need_weights)[0]], [m(x, need_weights=need_weights)[0]])
        counts.append(graphs.count)
    assert counts == [1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.parametrize("need_weights", [True, False])
def test_compile_dynamic_cross_attention_with_mask(need_weights, graphs):
    # T and S are two different symbols here, so no shortcut may assume T == S.
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=1).eval()
    f = torch.compile(m, backend=graphs, fullgraph=True, dynamic=True)
    for T, S in ((5, 9), (8, 3)):
        x, context = torch.randn(2, T, 16), torch.randn(2, S, 16)
        keep = mha.padding_mask([S, S - 1], S)[:, None, None, :]
        expected = m(x, context, mask=keep, need_weights=need_weights)
        actual = f(x, context, mask=keep, need_weights=need_weights)
        assert_all_close([t for t in actual if t is not None], [t for t in expected if t is not None])
    assert graphs.count == 1


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("need_weights", [True, False])
def test_jit_trace_runs_at_other_lengths(need_weights):
    # Traced sizes are 0-dim tensors; the causal mask is built from them, so the trace follows the length.
    # (The validation checks become TracerWarnings and constants: a trace does not re-check its inputs.)
    layer = Layer(mha.MultiHeadAttention(16, 4, n_kv_heads=2).eval(), need_weights)
    traced = torch.jit.trace(layer, inputs(7, masked=True))
    for length in (1, 3, 12):
        args = inputs(length, masked=True)
        assert_all_close(traced(*args), layer(*args))


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                    reason="inductor on CPU needs a C++ compiler (g++ or clang++)")
def test_inductor_compiled_fused_path_matches_eager():
    torch.compiler.reset()
    m = mha.MultiHeadAttention(16, 4).eval()
    f = torch.compile(m, backend="inductor", fullgraph=True)
    x = torch.randn(2, 7, 16)
    y, w = f(x, need_weights=False)
    assert w is None
    assert_close(y, m(x, need_weights=False)[0], atol=1e-6)
    torch.compiler.reset()
