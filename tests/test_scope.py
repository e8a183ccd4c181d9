"""Modes outside the lesson's own code that work by a public recipe (docs/compatibility.md), in float64.

Second derivatives through the fused path: ``need_weights=True``, or ``need_weights=False`` under
``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``; ``torch.func`` transforms on the explicit path. Each is
compared with plain autograd on the explicit path, and checked against finite differences.
"""

import pytest
import torch
import torch.func as tf
from helpers import assert_close
from torch.autograd import gradgradcheck
from torch.nn.attention import SDPBackend, sdpa_kernel

import mha

pytestmark = pytest.mark.usefixtures("one_thread")


def layer_and_x():
    m = mha.MultiHeadAttention(8, 2, dtype=torch.float64)
    return m, torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)


def penalty_gradient(f, x):
    """A gradient penalty (WGAN-GP, MAML's inner step): the gradient's norm as a loss, differentiated again."""
    (g,) = torch.autograd.grad(f(x).pow(2).sum(), x, create_graph=True)
    return torch.autograd.grad(g.pow(2).sum(), x)[0]


@pytest.mark.c25
def test_second_derivatives_on_the_fused_path_by_the_math_kernel_equal_the_explicit_paths():
    """C25: a gradient penalty through the fused path raised "derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"; the recipe gives the numbers."""
    m, x = layer_and_x()
    explicit = penalty_gradient(lambda x: m(x)[0], x)
    with sdpa_kernel(SDPBackend.MATH):
        fused = penalty_gradient(lambda x: m(x, need_weights=False)[0], x)
        assert gradgradcheck(lambda x: m(x, need_weights=False)[0], (x,))
    assert_close(fused, explicit)
    assert gradgradcheck(lambda x: m(x)[0], (x,))


def test_torch_func_grad_vmap_of_grad_and_jacrev_on_the_explicit_path_equal_autograd():
    m, x = layer_and_x()

    def loss(xi):  # one sample (T, d_model)
        return m(xi[None])[0].pow(2).sum()

    whole = torch.autograd.grad(m(x)[0].pow(2).sum(), x)[0]  # each sample's loss is its own: per-sample gradients
    assert_close(tf.grad(lambda x: m(x)[0].pow(2).sum())(x), whole)
    assert_close(tf.vmap(tf.grad(loss))(x), whole)
    assert_close(tf.jacrev(lambda x: m(x)[0])(x), torch.autograd.functional.jacobian(lambda x: m(x)[0], x))
