"""``mha.scaled_dot_product_attention`` (mha/attention.py) against ``F.scaled_dot_product_attention``, in float64.

Both of mha's paths, the explicit one (``need_weights=True``) and the fused one, are compared with PyTorch's
function given the same bool mask. PyTorch's weights are read off as its output for v = the identity: the weights
times I. Where PyTorch and mha differ on purpose (bottom-right causal, keys behind a mask, rows with no key), the
reference is PyTorch on the inputs that mean the same.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st

import mha

pytestmark = pytest.mark.usefixtures("one_thread")

PATHS = pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])


def torch_weights(q, k, keep=None, scale=None):
    """PyTorch's attention weights (..., T, S): its output when v is the identity."""
    eye = torch.eye(k.size(-2), dtype=q.dtype).expand(*k.shape[:-1], k.size(-2))
    return F.scaled_dot_product_attention(q, k, eye, attn_mask=keep, scale=scale)


@st.composite
def attention_inputs(draw):
    """q (..., T, d_k), k (..., S, d_k), v (..., S, d_v) with broadcasting leading dims, a keep-mask or None."""
    T, S, d_k, d_v = (draw(st.integers(1, 5)) for _ in range(4))
    lead = draw(st.sampled_from([(), (2,), (2, 3)]))
    k_lead = tuple(draw(st.sampled_from([n, 1])) for n in lead)  # k and v may broadcast against q
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(*lead, T, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(*k_lead, S, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(*k_lead, S, d_v, generator=g, dtype=torch.float64)
    keep = None
    if draw(st.booleans()):
        keep = torch.rand(*draw(st.sampled_from([lead, lead[-1:], ()])), T, S, generator=g) > 0.4
        keep[..., 0] = True  # every query keeps a key (rows with none: test_fully_masked_rows_*)
    scale = draw(st.sampled_from([None, 0.3]))
    return q, k, v, keep, draw(st.booleans()), scale


@pytest.mark.c5
@given(attention_inputs())
def test_both_paths_equal_pytorch_sdpa_given_the_same_mask(inputs):
    """C5's kind: causal, scale, broadcast leading dims and keep-masks, against PyTorch told the same mask."""
    q, k, v, keep, is_causal, scale = inputs
    intent = keep
    if is_causal:  # bottom-right, as mha.causal_mask: PyTorch's is_causal would align it top-left
        causal = mha.causal_mask(q.size(-2), k.size(-2))
        intent = causal if keep is None else keep & causal
    has_key = None if intent is None else intent.any(-1, keepdim=True)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=intent, scale=scale)
    weights = torch_weights(q, k, intent, scale)
    if has_key is not None:  # a causal row with T > S has no key: PyTorch's NaN is mha's zero
        expected, weights = expected.where(has_key, 0.0), weights.where(has_key, 0.0)
    for need_weights in (True, False):
        out, w = mha.scaled_dot_product_attention(q, k, v, keep, is_causal=is_causal, scale=scale,
                                                  need_weights=need_weights)
        assert_close(out, expected)
        if need_weights:
            assert_close(w, weights.expand_as(w))
        else:
            assert w is None


@pytest.mark.c3
@PATHS
def test_a_bool_tril_mask_means_what_pytorch_sdpa_is_causal_means(need_weights):
    """C3: nn.MultiheadAttention reads a bool mask as True = blocked, F.scaled_dot_product_attention as True =
    attend; mha's reading must be the latter."""
    q, k, v = (torch.randn(1, 1, 4, 4) for _ in range(3))
    out, _ = mha.scaled_dot_product_attention(q, k, v, torch.ones(4, 4).tril().bool(), need_weights=need_weights)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)


@pytest.mark.c5
@PATHS
def test_one_new_token_sees_every_cached_key(need_weights):
    """C5: q (1, 1, 1, 4) against five keys with is_causal=True saw only key 0 (top-left); it must see all 5."""
    q, k, v = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    out, _ = mha.scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=need_weights)
    assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6)


@pytest.mark.c14
@PATHS
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 1e10])
def test_a_key_blocked_for_every_query_never_reaches_the_output(bad, need_weights):
    """C14: a blocked key holding inf or NaN made F.scaled_dot_product_attention's output NaN
    (pytorch/pytorch#101967): no query may look at it, so it must change nothing, gradients included."""
    finite = torch.arange(8, dtype=torch.float64).reshape(1, 2, 4) / 8
    keep = torch.tensor([[[True, False], [True, False]]])  # key 1 is blocked for both queries
    k = finite.clone()
    k[0, 1, 0] = bad
    q, k, v = finite.clone().requires_grad_(), k.requires_grad_(), k.detach().clone().requires_grad_()
    out, w = mha.scaled_dot_product_attention(q, k, v, keep, need_weights=need_weights)
    assert_close(out, F.scaled_dot_product_attention(finite, finite, finite, attn_mask=keep))
    out.sum().backward()
    assert all(t.grad.isfinite().all() for t in (q, k, v))
    assert not k.grad[0, 1].any() and not v.grad[0, 1].any()  # nothing flows to the blocked key


@pytest.mark.c4
@pytest.mark.c14
@PATHS
def test_fully_masked_rows_are_zero_and_the_others_untouched_whatever_the_blocked_keys_hold(need_weights):
    """C4: a padded sample (every key masked) gave NaN that reached the other samples' gradients. C14: a row whose
    keys are all blocked is zero even when every key and value is NaN."""
    q, k, v = (torch.randn(2, 2, 3, 4, dtype=torch.float64) for _ in range(3))
    q[1], k[1], v[1] = float("nan"), float("nan"), float("nan")  # sample 1: padding, garbage included
    keep = mha.padding_mask([3, 0])[:, None, None, :]  # (B, 1, 1, S): sample 1 has no key
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, w = mha.scaled_dot_product_attention(q, k, v, keep, need_weights=need_weights)
    assert torch.equal(out[1], torch.zeros(2, 3, 4)) and (w is None or torch.equal(w[1], torch.zeros(2, 3, 3)))
    assert_close(out[0], F.scaled_dot_product_attention(q[0], k[0], v[0]))
    out[0].sum().backward()
    for t in (q, k, v):
        assert t.grad.isfinite().all() and not t.grad[1].any()


@PATHS
def test_half_precision_scores_that_overflow_float16_stay_finite(need_weights):
    """Scores of 6e5, past float16's 65504: the explicit path computes scores and softmax in float32."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g).half() * s for s in (300, 300, 1))
    out, w = mha.scaled_dot_product_attention(q, k, v, need_weights=need_weights)
    assert out.dtype == torch.float16 and (w is None or w.dtype == torch.float16)
    assert_close(out.float(), F.scaled_dot_product_attention(q.float(), k.float(), v.float()), atol=1e-2)


def test_dropout_zeroes_weights_and_scales_the_rest_by_one_over_keep_probability():
    q, k, v = torch.randn(4, 64, 8), torch.randn(4, 64, 8), torch.eye(64).expand(4, 64, 64)
    p = 0.3
    dropped, w = mha.scaled_dot_product_attention(q, k, v, dropout_p=p)
    kept = w != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.02
    assert_close(w[kept], torch_weights(q, k)[kept] / (1 - p), atol=1e-6)
    assert torch.equal(dropped, w)  # v = I: the output is the dropped weights, as applied


def test_the_fused_path_draws_pytorchs_dropout():
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    torch.manual_seed(1)
    out, _ = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.5, need_weights=False)
    torch.manual_seed(1)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
