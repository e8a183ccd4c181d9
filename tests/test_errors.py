"""Learner mistakes: each raises a ValueError or TypeError whose message names the values and the fix.

Where a mistake is PyTorch's to report (a float64 x into a float32 layer: ``nn.Linear`` says so when it runs,
tests/test_multihead.py), PyTorch's own error stands, and it is not listed here.
"""

import ast
import pathlib

import numpy as np
import pytest
import torch
from torch import nn

import mha

pytestmark = pytest.mark.usefixtures("one_thread")

M = mha.MultiHeadAttention(8, 2)
G = mha.GroupedQueryAttention(8, 2, 1)
x = torch.randn(2, 3, 8)
q = torch.randn(2, 3, 4)
tril = torch.tril(torch.ones(3, 3))


def filled(max_len=None, layer=G):
    cache = mha.KVCache(max_len=max_len)
    layer(x, cache=cache)
    return cache


def hooked():
    m = mha.MultiHeadAttention(8, 2)
    m.qkv.register_forward_hook(lambda module, args, out: out)
    return m


MISUSES = [  # (id, call, exception, regex that the message must match[, the case's marker])
    # -- x and context
    ("x 2-D", lambda: M(torch.randn(3, 8)), ValueError, r"x must be \(B, T, d_model=8\), got shape \(3, 8\)"),
    ("x width", lambda: M(torch.randn(2, 3, 7)), ValueError, r"d_model=8.*\(2, 3, 7\)"),
    ("x not a tensor", lambda: M([[0.0] * 8]), TypeError, r"x must be a torch.Tensor, got list"),
    ("integer x", lambda: M(x.long()), TypeError, r"x must be a floating tensor .*, got torch.int64"),
    ("float8 x", lambda: M(x.to(torch.float8_e4m3fn)), TypeError,
     r"x must be a floating tensor \(float16, bfloat16, float32 or float64\), got torch.float8_e4m3fn"),
    ("nested x", lambda: M(torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)),
     TypeError, r"x is a nested tensor; pass a padded tensor \(x.to_padded_tensor\(0.0\)\) and a padding mask"),
    ("sparse x", lambda: M(x.to_sparse()), TypeError, r"x must be a dense tensor, got layout torch.sparse_coo: pass "
                                                      r"x.to_dense\(\)"),
    ("context width", lambda: M(x, torch.randn(2, 5, 4)), ValueError,
     r"context must be \(B, S, d_model=8\).*\(2, 5, 4\)"),
    ("context batch", lambda: M(x, torch.randn(3, 5, 8)), ValueError, r"context batch 3 differs from x batch 2"),
    ("the article's m(x, False)", lambda: M(x, False), TypeError,
     r"context must be a torch.Tensor, got bool; context, the second positional argument, .*m\(x, causal=False\)"),
    ("the article's m(x, mask)", lambda: M(x, torch.ones(3, 3).tril()), ValueError,
     r"got shape \(3, 3\); context, the second positional argument, .*m\(x, mask=keep\)"),
    ("a bool mask passed by position", lambda: M(x, torch.ones(2, 1, 1, 3, dtype=torch.bool)), TypeError,
     r"got torch.bool; context, the second positional argument"),
    # -- flags
    ("causal=True with a context", lambda: M(x, torch.randn(2, 5, 8), causal=True), ValueError,
     r"causal=True with a context: x and context are different sequences.*pass a mask to restrict it"),
    ("mask passed as causal", lambda: M(x, causal=torch.ones(3, 3).bool()), TypeError,
     r"causal must be True or False \(a Python bool\), got torch.Tensor"),
    ("numpy bool flag", lambda: M(x, need_weights=np.bool_(True)), TypeError, r"need_weights .* got numpy.bool"),
    ("is_causal an int", lambda: mha.scaled_dot_product_attention(q, q, q, is_causal=1), TypeError, r"is_causal.*int"),
    # -- masks
    ("mask shape", lambda: M(x, mask=torch.ones(4, 4, dtype=torch.bool)), ValueError,
     r"mask of shape \(4, 4\) does not broadcast to \(B, h, T, S\) = \(2, 2, 3, 3\)"),
    ("(B, S) padding mask", lambda: M(x, torch.randn(2, 5, 8), mask=torch.ones(2, 5)), ValueError,
     r"a \(B, S\) padding mask goes in as mask\[:, None, None, :\]"),
    ("(B, 1, S) padding mask", lambda: M(torch.randn(3, 4, 8), mask=torch.ones(3, 1, 4)), ValueError,
     r"a \(B, 1, S\) padding mask goes in as mask\[:, None\]"),
    ("(B, T, S) per-sample mask", lambda: mha.MultiHeadAttention(8, 4)(x, mask=torch.ones(2, 3, 3)), ValueError,
     r"a per-sample \(B, T, S\) mask goes in as mask\[:, None\]"),
    ("padding mask shorter than the batch", lambda: M(x, mask=mha.padding_mask([2, 1])[:, None, None, :]),
     ValueError, r"S = 3 here \(for mha.padding_mask\(lengths\), pass S=3\)"),
    ("cross-attention mask made for the queries", lambda: M(x, torch.randn(2, 5, 8), mask=torch.ones(2, 1, 1, 3)),
     ValueError, r"its last dim is the keys: S = 5 here, against T = 3 queries"),
    ("integer mask not 0/1", lambda: M(x, mask=torch.tensor([[0, 1, 2]] * 3)), ValueError,
     r"torch.int64 mask holds values other than 0 and 1 \(e.g. 2\)"),
    ("mask not a tensor", lambda: M(x, mask=[[1, 0, 0]] * 3), TypeError, r"mask must be a torch.Tensor, got list"),
    ("sparse mask", lambda: M(x, mask=tril.to_sparse()), TypeError, r"mask must be a dense tensor.*mask.to_dense\(\)"),
    ("complex mask", lambda: mha.as_keep_mask(torch.ones(2, dtype=torch.complex64)), TypeError, r"complex64"),
    ("mask grows the scores", lambda: mha.scaled_dot_product_attention(q, q, q, torch.ones(5, 2, 3, 3)), ValueError,
     r"\(5, 2, 3, 3\) does not broadcast to \(..., T, S\) = \(2, 3, 3\)"),
    ("causal_mask float size", lambda: mha.causal_mask(2.5), TypeError, r"T must be an int, got 2.5"),
    ("padding lengths one int", lambda: mha.padding_mask(3), TypeError,
     r"lengths must be a list of ints or a 1-D integer tensor, one length per sequence, got int 3"),
    ("padding lengths too long", lambda: mha.padding_mask([3, 5], 4), ValueError, r"\[0, S=4\], got \[3, 5\]"),
    ("padding lengths float", lambda: mha.padding_mask(torch.tensor([1.5])), TypeError, r"integers, got torch.float32"),
    # -- sizes
    ("d_model % h", lambda: mha.MultiHeadAttention(512, 6), ValueError,
     r"d_model=512 is not divisible by h=6.*try h in \[1, 2, 4, 8, 16, 32, 64\]", pytest.mark.c7),
    ("h not int", lambda: mha.MultiHeadAttention(32, 4.0), TypeError, r"h must be an int, got 4.0"),
    ("h zero", lambda: mha.MultiHeadAttention(32, 0), ValueError, r"h must be positive, got 0"),
    ("dropout 1", lambda: mha.MultiHeadAttention(8, 2, dropout=1.0), ValueError,
     r"dropout must be in \[0, 1\), got 1.0"),
    ("dropout a string", lambda: mha.scaled_dot_product_attention(q, q, q, dropout_p="0.1"), TypeError,
     r"dropout_p must be a number in \[0, 1\), got '0.1'"),
    # -- scaled_dot_product_attention's q, k, v
    ("q/k width", lambda: mha.scaled_dot_product_attention(q, torch.randn(2, 3, 5), q), ValueError,
     r"q and k need the same positive last dim d_k, got q \(2, 3, 4\) and k \(2, 3, 5\)"),
    ("k/v length", lambda: mha.scaled_dot_product_attention(q, q, torch.randn(2, 4, 4)), ValueError,
     r"k and v need the same length S"),
    ("batch dims", lambda: mha.scaled_dot_product_attention(q, torch.randn(3, 3, 4), torch.randn(3, 3, 4)),
     ValueError, r"leading dims .* do not broadcast"),
    ("q 1-D", lambda: mha.scaled_dot_product_attention(torch.randn(4), q, q), ValueError, r"at least 2-D"),
    ("dtypes differ", lambda: mha.scaled_dot_product_attention(q, q.double(), q), TypeError,
     r"q, k, v must share a dtype, got torch.float32, torch.float64, torch.float32"),
    ("scale a string", lambda: mha.scaled_dot_product_attention(q, q, q, scale="a"), TypeError,
     r"scale must be a number \(default None: 1 / sqrt\(d_k\)\), got str 'a'"),
    ("scale inf", lambda: mha.scaled_dot_product_attention(q, q, q, scale=float("inf")), ValueError,
     r"scale must be finite, got inf"),
    # -- grouped-query attention and the KV cache
    ("n_kv_heads does not divide h", lambda: mha.GroupedQueryAttention(32, 4, 3), ValueError,
     r"n_kv_heads=3 must divide h=4"),
    ("d_k a float", lambda: mha.GroupedQueryAttention(32, 4, d_k=2.5), TypeError, r"d_k must be an int, got 2.5"),
    ("cache with a context", lambda: G(x, torch.randn(2, 3, 8), cache=mha.KVCache()), ValueError,
     r"a KVCache is for self-attention decoding; don't pass it with a context"),
    ("cache not a KVCache", lambda: G(x, cache={}), TypeError, r"cache must be an mha.KVCache, got dict"),
    ("cache mask without the new token", lambda: G(x[:, :1], cache=filled(), mask=torch.ones(2, 1, 1, 3)), ValueError,
     r"\(2, 1, 1, 3\) does not broadcast to \(B, h, T, S\) = \(2, 2, 1, 4\)"),
    ("cache of another layer", lambda: mha.GroupedQueryAttention(8, 2, 1)(x, cache=filled()), ValueError,
     r"holds the keys of another layer, GroupedQueryAttention\(d_model=8, h=2, n_kv_heads=1.*reset\(\) this one"),
    ("cache of another batch", lambda: G(torch.randn(3, 1, 8), cache=filled()), ValueError,
     r"new keys \(3, 1, 1, 4\) don't fit the cache \(2, 1, 3, 4\).*use a fresh KVCache for a new batch"),
    ("cache past max_len", lambda: G(x, cache=filled(max_len=5)), ValueError,
     r"3 new positions after 3 cached would make 6, past the cache's max_len=5"),
    ("max_len a float", lambda: mha.KVCache(max_len=2.5), TypeError, r"max_len must be an int, got 2.5"),
    ("reorder one int", lambda: filled().reorder(1), TypeError,
     r"beams must be batch row indices: a list of ints or a 1-D integer tensor, got int 1"),
    ("reorder out of range", lambda: filled().reorder([0, 2]), ValueError, r"\[0, B=2\), got \[0, 2\]"),
    # -- interop and the tools beside the lesson
    ("to_torch with fewer K/V heads", lambda: mha.to_torch(G), ValueError, r"n_kv_heads=1 < h=2"),
    ("to_torch with heads wider than d_model", lambda: mha.to_torch(mha.GroupedQueryAttention(8, 2, d_k=8)),
     ValueError, r"h=2 heads of d_k=8 make 16, not d_model=8"),
    ("to_torch of a wrapped qkv", lambda: mha.to_torch(hooked()), ValueError,
     r"mha.to_torch copies the weights of qkv instead of calling it, so it cannot apply what wraps it: qkv has "
     r"forward hooks"),
    ("from_torch kdim/vdim", lambda: mha.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4)), ValueError,
     r"not supported: kdim=4 / vdim=4"),
    ("from_torch add_bias_kv", lambda: mha.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True)), ValueError,
     r"not supported: add_bias_kv"),
    ("from_torch of a Linear", lambda: mha.from_torch(nn.Linear(2, 2)), TypeError, r"got Linear"),
    ("from_torch of a subclass that computes with its own weights",
     lambda: mha.from_torch(torch.ao.nn.quantizable.MultiheadAttention(8, 2)), ValueError,
     r"computes with its own weights, not in_proj_weight"),
    ("to_torch of heads whose out has no bias",
     lambda: mha.to_torch(mha.parallel.from_heads(M, [0, 1], out_bias=False)), ValueError,
     r"qkv has bias but out has none"),
    ("to_torch_attn_mask 4-D without shape", lambda: mha.to_torch_attn_mask(torch.ones(2, 1, 1, 3)), ValueError,
     r"needs shape=\(B, h, T, S\)"),
    ("to_additive_mask dtype a string", lambda: mha.to_additive_mask(tril, "float32"), TypeError,
     r"dtype must be a torch.dtype such as torch.float32, got str 'float32'"),
    ("split_heads width", lambda: mha.split_heads(torch.randn(2, 3, 7), 2), ValueError, r"h=2, got shape \(2, 3, 7\)"),
    ("merge_heads 3-D", lambda: mha.merge_heads(x), ValueError, r"\(B, h, T, d_k\), got shape \(2, 3, 8\)"),
    ("project of a Linear", lambda: mha.project(nn.Linear(8, 8), x), TypeError, r"mha.MultiHeadAttention, got Linear"),
    ("count_parameters of a tensor", lambda: mha.count_parameters(torch.ones(2)), TypeError, r"nn.Module, got Tensor"),
]


@pytest.mark.parametrize("call, error, message", [pytest.param(*c[1:4], id=c[0], marks=c[4:]) for c in MISUSES])
def test_a_mistake_raises_an_error_that_names_the_values_and_the_fix(call, error, message):
    """C7 among them: MultiHeadAttention(512, 6) must raise naming 512 and 6; PyTorch's message names neither."""
    with pytest.raises(error, match=message):
        call()


def test_no_bare_asserts_guard_user_input():
    """python -O strips asserts: a check on user input must raise."""
    for path in pathlib.Path(mha.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)], path.name
