"""Property-based agreement with PyTorch over random configurations (issue 3).

Each example draws d_model and h (h = 1 and h = d_model included), B, T, S
(S != T is cross-attention), bias, causal, and a random keep-mask of one of the
broadcastable shapes, or a padding mask built from lengths. Both our paths
(explicit with weights, fused without) must match nn.MultiheadAttention and
F.scaled_dot_product_attention: 1e-10 in float64, 1e-5 in float32.

The three layer tests run 400, 150 and 150 examples under the ci profile (tests/conftest.py), and under any other
profile as many times more as its max_examples is ci's (helpers.examples): HYPOTHESIS_PROFILE=dev runs 1,333, 500
and 500. They take seconds, so they are marked slow.
"""

import pytest
import torch
from helpers import assert_close, examples, sdpa_reference, torch_reference
from hypothesis import given
from hypothesis import strategies as st

import mha

MASK_SHAPES = ["T,S", "B,1,1,S", "B,h,T,S", "1,h,1,S", "B,1,T,S", "h,T,S", "S", "1,1,T,S", "lengths"]


@st.composite
def attention_cases(draw):
    h = draw(st.integers(1, 4))
    d_k = draw(st.integers(1, 4))
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    cross = draw(st.booleans())
    S = draw(st.integers(1, 6)) if cross else T
    kind = draw(st.sampled_from([None, *MASK_SHAPES]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    keep = None
    if kind == "lengths":
        lengths = torch.randint(0, S + 1, (B,), generator=g)
        keep = mha.padding_mask(lengths, S)[:, None, None, :]
    elif kind is not None:
        sizes = {"B": B, "h": h, "T": T, "S": S, "1": 1}
        shape = [sizes[n] for n in kind.split(",")]
        keep = torch.rand(shape, generator=g) > draw(st.sampled_from([0.2, 0.5]))
    return dict(
        d_model=h * d_k, h=h, B=B, T=T, S=S, cross=cross, keep=keep, seed=seed,
        bias=draw(st.booleans()), causal=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float64, torch.float32])),
    )


@pytest.mark.slow
@examples(400)
@given(attention_cases())
def test_module_matches_pytorch(case):
    torch.manual_seed(case["seed"])
    dtype, B, T, S, h = case["dtype"], case["B"], case["T"], case["S"], case["h"]
    m = mha.MultiHeadAttention(case["d_model"], h, bias=case["bias"]).to(dtype)
    x = torch.randn(B, T, case["d_model"], dtype=dtype)
    context = torch.randn(B, S, case["d_model"], dtype=dtype) if case["cross"] else None
    keep, causal = case["keep"], case["causal"]
    if context is not None:  # cross-attention is never causal: None (the default) or False say so
        causal = None if causal else False

    # What the reference must be told: the causal mask applies to self-attention only.
    intent = keep
    if causal and context is None:
        intent = mha.causal_mask(T) if keep is None else keep & mha.causal_mask(T)
    allowed = torch.ones(B, h, T, S, dtype=torch.bool) if intent is None else intent.expand(B, h, T, S)
    has_key = allowed.any(-1)  # (B, h, T)
    row_ok = has_key.all(1)  # (B, T): PyTorch gives NaN in rows where any head has no key

    y, w = m(x, context, causal=causal, mask=keep)
    y_fused, _ = m(x, context, causal=causal, mask=keep, need_weights=False)
    y_ref, w_ref = torch_reference(m, x, context, intent)
    y_sdpa = sdpa_reference(m, x, context, intent)

    assert_close(w[has_key], w_ref[has_key])
    assert torch.equal(w[~has_key], torch.zeros_like(w[~has_key]))
    for ours in (y, y_fused):
        assert_close(ours[row_ok], y_ref[row_ok])
        assert_close(ours[row_ok], y_sdpa[row_ok])
        assert torch.isfinite(ours).all()
    assert_close(y_fused, y)


@pytest.mark.slow
@examples(150)
@given(attention_cases(), st.sampled_from([1, 2]))
def test_gqa_with_all_kv_heads_is_plain_mha(case, _):
    # n_kv_heads = h is exactly the plain module: same parameters, same outputs.
    torch.manual_seed(case["seed"])
    plain = mha.MultiHeadAttention(case["d_model"], case["h"], bias=case["bias"])
    torch.manual_seed(case["seed"])
    gqa = mha.MultiHeadAttention(case["d_model"], case["h"], n_kv_heads=case["h"], bias=case["bias"])
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), gqa.state_dict().values()))
    x = torch.randn(case["B"], case["T"], case["d_model"])
    for need_weights in (True, False):
        a = plain(x, mask=case["keep"] if not case["cross"] else None, need_weights=need_weights)
        b = gqa(x, mask=case["keep"] if not case["cross"] else None, need_weights=need_weights)
        assert torch.equal(a[0], b[0])


@pytest.mark.slow
@examples(150)
@given(attention_cases(), st.integers(1, 4))
def test_grouped_query_matches_expanded_heads(case, g_seed):
    # GQA equals plain MHA whose K/V projections repeat each K/V head h/g times.
    h = case["h"]
    g = [d for d in range(1, h + 1) if h % d == 0][g_seed % len([d for d in range(1, h + 1) if h % d == 0])]
    d_model, d_k = case["d_model"], case["d_model"] // h
    torch.manual_seed(case["seed"])
    gqa = mha.MultiHeadAttention(d_model, h, n_kv_heads=g, bias=case["bias"]).double()
    plain = mha.MultiHeadAttention(d_model, h, bias=case["bias"]).double()
    with torch.no_grad():
        w_q, w_k, w_v = gqa.qkv.weight.split([d_model, g * d_k, g * d_k])
        expand = lambda t: t.unflatten(0, (g, d_k)).repeat_interleave(h // g, 0).flatten(0, 1)  # noqa: E731
        plain.qkv.weight.copy_(torch.cat([w_q, expand(w_k), expand(w_v)]))
        if case["bias"]:
            b_q, b_k, b_v = gqa.qkv.bias.split([d_model, g * d_k, g * d_k])
            plain.qkv.bias.copy_(torch.cat([b_q, expand(b_k[:, None])[:, 0], expand(b_v[:, None])[:, 0]]))
        plain.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(case["B"], case["T"], d_model, dtype=torch.float64)
    keep = None if case["cross"] else case["keep"]
    y_ref, w_ref = plain(x, mask=keep, causal=case["causal"])
    for need_weights in (True, False):
        y, w = gqa(x, mask=keep, causal=case["causal"], need_weights=need_weights)
        assert_close(y, y_ref, atol=1e-10)
        if need_weights:
            assert_close(w, w_ref, atol=1e-10)


@given(st.lists(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4), min_size=1, max_size=4))
def test_broadcast_shapes_agrees_with_torch(shapes):
    # mha.values.broadcast_shapes applies the rule itself for int sizes (it is much cheaper than PyTorch's).
    from mha.values import broadcast_shapes

    try:
        expected = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        expected = None
    if expected is None:
        with pytest.raises(RuntimeError, match="do not broadcast"):
            broadcast_shapes(*shapes)
    else:
        assert broadcast_shapes(*shapes) == expected
