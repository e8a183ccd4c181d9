"""Every misuse we could think of raises ValueError or TypeError naming the values (issue 3)."""

import pytest
import torch
from torch import nn

import mha

M = mha.MultiHeadAttention(8, 2)
x = torch.randn(2, 3, 8)
q = torch.randn(2, 3, 4)
tril = torch.tril(torch.ones(3, 3))

MISUSES = [  # (id, call, exception, regex that the message must match)
    ("x 2-D", lambda: M(torch.randn(3, 8)), ValueError, r"x must be \(B, T, d_model=8\), got shape \(3, 8\)"),
    ("x 4-D", lambda: M(torch.randn(1, 2, 3, 8)), ValueError, r"got shape \(1, 2, 3, 8\)"),
    ("x width", lambda: M(torch.randn(2, 3, 7)), ValueError, r"d_model=8.*\(2, 3, 7\)"),
    ("x not a tensor", lambda: M([[0.0] * 8]), TypeError, r"x must be a torch.Tensor, got list"),
    ("context 2-D", lambda: M(x, torch.randn(5, 8)), ValueError, r"context must be \(B, S, d_model=8\).*\(5, 8\)"),
    ("context width", lambda: M(x, torch.randn(2, 5, 4)), ValueError, r"context.*\(2, 5, 4\)"),
    ("context batch", lambda: M(x, torch.randn(3, 5, 8)), ValueError, r"context batch 3 differs from x batch 2"),
    ("mask shape", lambda: M(x, mask=torch.ones(4, 4, dtype=torch.bool)), ValueError,
     r"mask of shape \(4, 4\) does not broadcast to \(B, h, T, S\) = \(2, 2, 3, 3\)"),
    ("padding mask (B, S) without None dims", lambda: M(x, torch.randn(2, 5, 8), mask=torch.ones(2, 5)), ValueError,
     r"mask\[:, None, None, :\]"),
    ("causal passed by position, as the article's forward takes it", lambda: M(x, False), TypeError,
     r"got bool; context, the second positional argument, .*m\(x, causal=False\)"),
    ("mask passed by position", lambda: M(x, torch.ones(2, 1, 1, 3, dtype=torch.bool)), ValueError,
     r"got shape \(2, 1, 1, 3\); context, the second positional argument, .*m\(x, mask=keep\)"),
    ("padding mask (B, 1, S)", lambda: M(torch.randn(3, 4, 8), mask=torch.ones(3, 1, 4, dtype=torch.bool)), ValueError,
     r"a \(B, 1, S\) padding mask goes in as mask\[:, None\]"),
    ("padding mask shorter than the padded batch", lambda: M(x, mask=mha.padding_mask([2, 1])[:, None, None, :]),
     ValueError, r"\(2, 1, 1, 2\) does not broadcast.*S = 3 here \(for mha.padding_mask\(lengths\), pass S=3\)"),
    ("cross-attention mask made for the queries", lambda: M(x, torch.randn(2, 5, 8), mask=torch.ones(2, 1, 1, 3)),
     ValueError, r"its last dim is the keys: S = 5 here, against T = 3 queries"),
    ("mask grows the scores", lambda: mha.scaled_dot_product_attention(q, q, q, torch.ones(5, 2, 3, 3)), ValueError,
     r"\(5, 2, 3, 3\) does not broadcast"),
    ("additive float mask", lambda: M(x, mask=torch.zeros(3, 3).masked_fill(tril == 0, float("-inf"))), ValueError,
     r"additive.*keep = \(additive_mask == 0\)"),
    ("integer mask not 0/1", lambda: M(x, mask=torch.tensor([[0, 1, 2]] * 3)), ValueError,
     r"torch.int64 mask holds values other than 0 and 1 \(e.g. 2\)"),
    ("mask not a tensor", lambda: M(x, mask=[[1, 0, 0]] * 3), TypeError, r"mask must be a torch.Tensor"),
    ("complex mask", lambda: mha.as_keep_mask(torch.ones(2, dtype=torch.complex64)), TypeError, r"complex64"),
    ("x float64, module float32", lambda: M(x.double()), TypeError, r"torch.float64.*torch.float32"),
    ("context dtype", lambda: M(x, torch.randn(2, 5, 8, dtype=torch.float64)), TypeError, r"context is torch.float64"),
    ("d_model % h", lambda: mha.MultiHeadAttention(30, 4), ValueError, r"d_model=30.*h=4"),
    ("h not int", lambda: mha.MultiHeadAttention(32, 4.0), TypeError, r"h must be an int, got 4.0"),
    ("h zero", lambda: mha.MultiHeadAttention(32, 0), ValueError, r"h must be positive, got 0"),
    ("n_kv_heads does not divide h", lambda: mha.MultiHeadAttention(32, 4, n_kv_heads=3), ValueError,
     r"n_kv_heads=3 must divide h=4"),
    ("negative dropout", lambda: mha.MultiHeadAttention(8, 2, dropout=-0.1), ValueError, r"\[0, 1\), got -0.1"),
    ("dropout 1", lambda: mha.MultiHeadAttention(8, 2, dropout=1.0), ValueError, r"\[0, 1\), got 1.0"),
    ("dropout_p >= 1", lambda: mha.scaled_dot_product_attention(q, q, q, dropout_p=1.5), ValueError, r"got 1.5"),
    ("dropout not a number", lambda: mha.scaled_dot_product_attention(q, q, q, dropout_p="0.1"), TypeError,
     r"'0.1'"),
    ("q/k width", lambda: mha.scaled_dot_product_attention(q, torch.randn(2, 3, 5), q), ValueError,
     r"q and k need the same last dim d_k, got q \(2, 3, 4\) and k \(2, 3, 5\)"),
    ("k/v length", lambda: mha.scaled_dot_product_attention(q, q, torch.randn(2, 4, 4)), ValueError,
     r"k and v need the same length S"),
    ("batch dims", lambda: mha.scaled_dot_product_attention(q, torch.randn(3, 3, 4), torch.randn(3, 3, 4)),
     ValueError, r"do not broadcast"),
    ("q 1-D", lambda: mha.scaled_dot_product_attention(torch.randn(4), q, q), ValueError, r"at least 2-D"),
    ("integer q", lambda: mha.scaled_dot_product_attention(torch.ones(3, 4, dtype=torch.long), q, q), TypeError,
     r"floating"),
    ("qkv dtypes differ", lambda: mha.scaled_dot_product_attention(q, q.double(), q), TypeError, r"share a dtype"),
    ("gqa heads", lambda: mha.scaled_dot_product_attention(torch.randn(1, 4, 3, 2), torch.randn(1, 3, 3, 2),
                                                         torch.randn(1, 3, 3, 2), enable_gqa=True), ValueError,
     r"g=3 to divide the query heads h=4"),
    ("from_torch kdim/vdim", lambda: mha.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4)), ValueError,
     r"not supported: kdim=4 / vdim=4"),
    ("from_torch bias_k", lambda: mha.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True)), ValueError,
     r"not supported: add_bias_kv"),
    ("from_torch add_zero_attn", lambda: mha.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True)),
     ValueError, r"add_zero_attn"),
    ("from_torch wrong type", lambda: mha.from_torch(nn.Linear(2, 2)), TypeError, r"got Linear"),
    ("to_torch with GQA", lambda: mha.to_torch(mha.MultiHeadAttention(8, 2, n_kv_heads=1)), ValueError,
     r"n_kv_heads=1 < h=2"),
    ("to_torch_attn_mask 4-D without shape", lambda: mha.to_torch_attn_mask(torch.ones(2, 1, 1, 3)), ValueError,
     r"needs shape=\(B, h, T, S\)"),
    ("causal=True with a context", lambda: M(x, torch.randn(2, 5, 8), causal=True), ValueError,
     r"causal=True with a context: x and context are different sequences"),
    ("need_weights a tensor, causal left out", lambda: M(x, need_weights=torch.ones(1)), TypeError,
     r"need_weights must be True or False"),
    ("cache with context", lambda: M(x, torch.randn(2, 3, 8), cache=mha.KVCache()), ValueError, r"self-attention"),
    ("cache wrong type", lambda: M(x, cache={}), TypeError, r"mha.KVCache"),
    ("padding lengths too long", lambda: mha.padding_mask([3, 5], 4), ValueError, r"\[0, S=4\].*\[3, 5\]"),
    ("padding lengths float", lambda: mha.padding_mask([1.5]), TypeError, r"integers"),
    ("count_parameters of a tensor", lambda: mha.count_parameters(torch.ones(2)), TypeError, r"nn.Module"),
    ("mask passed as causal", lambda: M(x, causal=torch.ones(3, 3).bool()), TypeError, r"causal must be True or False"),
    ("need_weights None", lambda: M(x, need_weights=None), TypeError, r"need_weights must be True or False"),
    ("is_causal not bool", lambda: mha.scaled_dot_product_attention(q, q, q, is_causal=1), TypeError, r"is_causal"),
    ("integer x", lambda: M(x.long()), TypeError, r"x must be a floating tensor, got torch.int64"),
    ("per-sample (B, T, S) mask", lambda: mha.MultiHeadAttention(8, 4)(x, mask=torch.ones(2, 3, 3)), ValueError,
     r"mask\[:, None\]"),
    ("d_k = 0", lambda: mha.scaled_dot_product_attention(torch.randn(2, 3, 0), torch.randn(2, 3, 0), q), ValueError,
     r"d_k must be positive"),
    ("gqa batch dims", lambda: mha.scaled_dot_product_attention(torch.randn(2, 4, 5, 8), torch.randn(3, 2, 6, 8),
                                                               torch.randn(3, 2, 6, 8), enable_gqa=True),
     ValueError, r"do not broadcast"),
    ("gqa zero kv heads", lambda: mha.scaled_dot_product_attention(torch.randn(2, 4, 5, 8), torch.randn(2, 0, 6, 8),
                                                                  torch.randn(2, 0, 6, 8), enable_gqa=True),
     ValueError, r"g=0"),
    ("additive mask of bool dtype", lambda: mha.to_additive_mask(tril, dtype=torch.bool), TypeError, r"floating"),
    ("causal_mask float size", lambda: mha.causal_mask(2.5), TypeError, r"T must be an int, got 2.5"),
    ("padding S float", lambda: mha.padding_mask([2, 3], S=3.5), TypeError, r"S must be an int"),
    ("split_heads width", lambda: mha.split_heads(torch.randn(2, 3, 7), 2), ValueError, r"h=2, got shape \(2, 3, 7\)"),
    ("split_heads h zero", lambda: mha.split_heads(x, 0), ValueError, r"h must be positive, got 0"),
    ("merge_heads 3-D", lambda: mha.merge_heads(x), ValueError, r"\(B, h, T, d_k\), got shape \(2, 3, 8\)"),
    ("scale a string", lambda: mha.scaled_dot_product_attention(q, q, q, scale="a"), TypeError,
     r"scale must be a number \(default None: 1 / sqrt\(d_k\)\), got str 'a'"),
    ("scale a bool", lambda: mha.scaled_dot_product_attention(q, q, q, scale=True), TypeError, r"got bool True"),
    ("scale NaN", lambda: mha.scaled_dot_product_attention(q, q, q, scale=float("nan")), ValueError,
     r"scale must be finite, got nan"),
    ("scale inf", lambda: mha.scaled_dot_product_attention(q, q, q, scale=float("inf"), need_weights=False),
     ValueError, r"scale must be finite, got inf"),
    ("reorder one int", lambda: _filled_cache().reorder(1), TypeError,
     r"beams must be batch row indices: a list of ints or a 1-D integer tensor, got int 1"),
    ("padding lengths one int", lambda: mha.padding_mask(3), TypeError,
     r"lengths must be a list of ints or a 1-D integer tensor, one length per sequence, got int 3"),
    ("from_heads one int", lambda: mha.MultiHeadAttention.from_heads(M, 1), TypeError,
     r"heads must be a range or sequence of query-head indices, got int 1"),
    ("from_heads bools", lambda: mha.MultiHeadAttention.from_heads(M, [True, False]), TypeError,
     r"head indices must be ints, got True"),
    ("to_torch_attn_mask 3 sizes", lambda: mha.to_torch_attn_mask(tril, (2, 3, 3)), ValueError,
     r"shape must be \(B, h, T, S\), four sizes, got \(2, 3, 3\)"),
    ("to_torch_attn_mask float size", lambda: mha.to_torch_attn_mask(tril, (2, 1, 3.0, 3)), TypeError,
     r"shape's T must be an int, got 3.0"),
    ("to_additive_mask dtype a string", lambda: mha.to_additive_mask(tril, "float32"), TypeError,
     r"dtype must be a torch.dtype such as torch.float32, got str 'float32'"),
    ("merge_heads of a list", lambda: mha.merge_heads([x]), TypeError, r"x must be a torch.Tensor, got list"),
]


def _filled_cache():
    cache = mha.KVCache()
    M(x, cache=cache)
    return cache


@pytest.mark.parametrize("call, error, message", [c[1:] for c in MISUSES], ids=[c[0] for c in MISUSES])
def test_misuse_raises_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_no_bare_asserts_guard_user_input():
    import ast
    import pathlib

    for path in pathlib.Path(mha.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)], path.name
