"""What the tests compare against (PyTorch's modules and kernels), one assert_close, and hypothesis example counts."""

import torch
import torch.nn.functional as F
from hypothesis import settings

import mha

TOL = {torch.float64: dict(rtol=0, atol=1e-10), torch.float32: dict(rtol=0, atol=1e-5)}


def assert_close(actual, expected, dtype=None, atol=None, where=None):
    """``torch.testing.assert_close`` with no relative tolerance: within ``atol``, or within TOL of the dtype.

    ``where`` (anything printable) goes in front of the failure message, to name the case in a loop.
    """
    tol = TOL[dtype or actual.dtype] if atol is None else dict(rtol=0, atol=atol)
    msg = None if where is None else lambda message: f"{where}: {message}"
    torch.testing.assert_close(actual, expected, msg=msg, **tol)


def examples(under_ci, profile=None):
    """Hypothesis settings for a test that needs more examples than the profile's max_examples.

    ``under_ci`` is the count under the ci profile (tests/conftest.py). Every other profile scales it by its own
    max_examples over ci's, so the profile still governs: HYPOTHESIS_PROFILE=dev, which runs more examples than
    ci, runs more of these too. ``profile`` names a profile to compute for instead of the loaded one.
    """
    chosen = settings.default if profile is None else settings.get_profile(profile)
    return settings(max_examples=round(under_ci * chosen.max_examples / settings.get_profile("ci").max_examples))


def torch_reference(m, x, context=None, keep=None):
    """y and per-head weights from nn.MultiheadAttention with m's weights.

    ``keep`` is our keep-mask, broadcastable to (B, h, T, S); it is converted to
    PyTorch's True = blocked convention here.
    """
    ref = mha.to_torch(m).eval()
    c = x if context is None else context
    B, T, S = x.size(0), x.size(1), c.size(1)
    attn_mask = None if keep is None else mha.to_torch_attn_mask(keep, shape=(B, m.h, T, S))
    return ref(x, c, c, attn_mask=attn_mask, average_attn_weights=False)


def sdpa_reference(m, x, context=None, keep=None):
    """y from F.scaled_dot_product_attention, with m's projections."""
    c = x if context is None else context
    q = mha.split_heads(F.linear(x, *_rows(m, 0)), m.h)
    k = mha.split_heads(F.linear(c, *_rows(m, 1)), m.h)
    v = mha.split_heads(F.linear(c, *_rows(m, 2)), m.h)
    attn_mask = None if keep is None else mha.as_keep_mask(keep).expand(*q.shape[:-1], k.size(-2))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return m.out(mha.merge_heads(out))


def _rows(m, i):
    d = m.d_model
    bias = None if m.qkv.bias is None else m.qkv.bias[i * d : (i + 1) * d]
    return m.qkv.weight[i * d : (i + 1) * d], bias
