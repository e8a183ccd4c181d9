"""Every kind of differentiation gives the same numbers on both paths (case C25 and its kind), in float64.

The explicit path (need_weights=True) is plain PyTorch operations, so every kind of autograd works through it.
The fused path (need_weights=False) calls F.scaled_dot_product_attention, whose fused CPU kernel has a first
derivative only: mha routes around it (mha/attention.py, "second derivatives on the fused path"). Each kind is
computed on both paths and compared; gradcheck and gradgradcheck compare each path with finite differences.
"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.func as tf
from helpers import assert_close
from torch.autograd import gradcheck, gradgradcheck
from torch.utils._python_dispatch import TorchDispatchMode

import mha

PATHS = pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])


def layer_and_input(setting, d_model=16):
    """A float64 layer, its x (2, 3, d_model), and its other per-sample inputs, for four settings a user meets."""
    torch.manual_seed(0)
    m = mha.MultiHeadAttention(d_model, 4, n_kv_heads=2 if setting == "grouped" else None).double()
    x = torch.randn(2, 3, d_model, dtype=torch.float64, requires_grad=True)
    per_sample = {}  # each with the batch first, so that vmap can take one sample of each
    if setting == "padding":  # sample 1 is all padding: every query of it has no key at all
        per_sample["mask"] = mha.padding_mask([2, 0], 3)[:, None, None, :]
    if setting == "cross":
        per_sample["context"] = torch.randn(2, 5, d_model, dtype=torch.float64)
    return m, x, per_sample


def on_path(m, need_weights, kwargs):
    """x -> y on one path."""
    return lambda x: m(x, need_weights=need_weights, **kwargs)[0]


def scalar_loss(f):
    return lambda x: f(x).pow(2).sum()


def gradient_penalty(f, x):
    """The case: the gradient's norm as a loss (WGAN-GP, MAML's inner step), differentiated again."""
    g, = torch.autograd.grad(scalar_loss(f)(x), x, create_graph=True)
    return torch.autograd.grad(g.pow(2).sum(), x)[0]


def forward_mode(f, x):
    with fwAD.dual_level():
        return fwAD.unpack_dual(f(fwAD.make_dual(x.detach(), torch.ones_like(x)))).tangent


KINDS = {
    "reverse": lambda f, x: torch.autograd.grad(scalar_loss(f)(x), x)[0],
    "create_graph": gradient_penalty,
    "autograd.functional.hvp": lambda f, x: torch.autograd.functional.hvp(scalar_loss(f), x, torch.ones_like(x))[1],
    "autograd.functional.jvp": lambda f, x: torch.autograd.functional.jvp(f, x, torch.ones_like(x))[1],
    "forward_ad": forward_mode,
    "func.jvp": lambda f, x: tf.jvp(f, (x,), (torch.ones_like(x),))[1],
    "func.jacfwd": lambda f, x: tf.jacfwd(f)(x),
    "func.jacrev": lambda f, x: tf.jacrev(f)(x),
    "func.grad(grad)": lambda f, x: tf.grad(lambda x: tf.grad(scalar_loss(f))(x).pow(2).sum())(x),
}
HESSIANS = {
    "autograd.functional.hessian": lambda f, x: torch.autograd.functional.hessian(scalar_loss(f), x),
    "func.hessian": lambda f, x: tf.hessian(scalar_loss(f))(x),
}


def test_C25_a_gradient_penalty_on_the_fused_path_equals_the_explicit_path():
    """The case: before, a raw "derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not
    implemented" at the second backward on the fused path."""
    m = mha.MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    penalties = {}
    for need_weights in (True, False):
        x.grad = None
        g, = torch.autograd.grad(m(x, need_weights=need_weights)[0].pow(2).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
        penalties[need_weights] = x.grad.clone()
    assert_close(penalties[False], penalties[True])
    assert penalties[True].abs().max() > 1e-3  # a real second derivative, not zeros on both paths
    assert gradgradcheck(lambda x: m(x, need_weights=False)[0], (x[:1].detach().requires_grad_(),))


SETTINGS = pytest.mark.parametrize("setting", ["causal", "padding", "cross", "grouped"])


@SETTINGS
@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_C25_every_kind_of_differentiation_gives_the_same_numbers_on_both_paths(kind, setting):
    m, x, kwargs = layer_and_input(setting)
    explicit, fused = (kind(on_path(m, need_weights, kwargs), x) for need_weights in (True, False))
    assert explicit.abs().max() > 1e-3
    assert_close(fused, explicit, where=setting)


@SETTINGS
def test_C25_vmap_of_grad_gives_the_same_per_sample_gradients_on_both_paths(setting):
    m, x, per_sample = layer_and_input(setting)

    def per_sample_gradients(need_weights):
        def loss(xi, one):  # one sample: x (T, d_model), and its mask or context without the batch
            return m(xi[None], need_weights=need_weights, **{key: t[None] for key, t in one.items()})[0].pow(2).sum()

        return tf.vmap(tf.grad(loss))(x, per_sample)

    explicit, fused = per_sample_gradients(True), per_sample_gradients(False)
    whole = torch.autograd.grad(m(x, **per_sample)[0].pow(2).sum(), x)[0]  # each sample's loss is its own
    assert_close(explicit, whole)
    assert_close(fused, explicit, where=setting)


@pytest.mark.parametrize("kind", HESSIANS.values(), ids=HESSIANS.keys())
def test_C25_hessians_agree_on_both_paths_and_with_each_other(kind):
    """The neighbour "autograd API": torch.autograd.functional.hessian and torch.func.hessian, on both paths."""
    m, x, kwargs = layer_and_input("padding", d_model=8)
    hessians = {need_weights: kind(on_path(m, need_weights, kwargs), x) for need_weights in (True, False)}
    assert hessians[True].shape == (2, 3, 8, 2, 3, 8)
    assert_close(hessians[False], hessians[True])
    # Against the other API, and against the gradient penalty's route (reverse over reverse): H v for v = 1.
    other = next(h for h in HESSIANS.values() if h is not kind)
    assert_close(hessians[False], other(lambda x: m(x, need_weights=False, **kwargs)[0], x))
    hvp = KINDS["autograd.functional.hvp"](lambda x: m(x, need_weights=False, **kwargs)[0], x)
    assert_close(hessians[False].flatten(3).sum(-1), hvp)


@pytest.mark.slow
@PATHS
@SETTINGS
def test_C25_both_paths_pass_gradcheck_and_gradgradcheck(setting, need_weights):
    m, x, kwargs = layer_and_input(setting, d_model=8)

    def f(x):
        return m(x, need_weights=need_weights, **kwargs)[0]

    assert gradcheck(f, (x,))
    assert gradgradcheck(f, (x,))


@PATHS
@pytest.mark.parametrize("wrt", ["q", "qkv", "x"], ids=["q only", "q, k, v", "one tensor as q, k and v"])
def test_C25_the_function_has_second_derivatives_for_any_inputs_that_need_them(wrt, need_weights):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64) for _ in range(3))
    keep = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    if wrt == "x":
        inputs = (q.requires_grad_(),)

        def f(x):
            return mha.scaled_dot_product_attention(x, x, x, keep, need_weights=need_weights)[0]
    else:
        inputs = (q, k, v) if wrt == "qkv" else (q,)
        for t in inputs:
            t.requires_grad_()

        def f(*args):
            q_, k_, v_ = (*args, k, v)[:3] if wrt == "q" else args
            return mha.scaled_dot_product_attention(q_, k_, v_, keep, need_weights=need_weights)[0]

    assert gradgradcheck(f, inputs)


class Ops(TorchDispatchMode):
    """Records the name of every aten operation that runs."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_C25_a_first_derivative_stays_on_the_fused_kernel():
    """The route around is taken only where it is needed: a plain backward runs PyTorch's fused backward, and no
    (T, S) softmax is computed, forward or backward."""
    m = mha.MultiHeadAttention(16, 4)
    x = torch.randn(2, 8, 16, requires_grad=True)
    with Ops() as ops:
        m(x, need_weights=False)[0].pow(2).sum().backward()
    kernels = [name for name in ops.names if "attention" in name or "softmax" in name]
    assert kernels == ["_scaled_dot_product_flash_attention_for_cpu.default",
                       "_scaled_dot_product_flash_attention_for_cpu_backward.default"], kernels
    with Ops() as ops:  # a second derivative: the math kernel's softmax, and its backward, appear
        gradient_penalty(lambda x: m(x, need_weights=False)[0], x)
    assert any(name.endswith("softmax.default") for name in ops.names)  # _softmax, or _safe_softmax (torch 2.5+)
    assert "_softmax_backward_data.default" in ops.names
