"""The layer itself (mha/multihead.py): what it computes beyond the references, and what PyTorch does to it.

Its numbers against ``nn.MultiheadAttention``, ``F.scaled_dot_product_attention`` and Hugging Face are
tests/test_references.py's. Here: its defaults, dropout, the head count in its checkpoints, and the workflows
PyTorch offers every module (deferred initialisation, wrapped submodules, reparametrizations, ``torch.func``,
compile, autocast), each compared with the same computation done without the workflow.
"""

import copy
import io
import pickle

import pytest
import torch
from helpers import assert_close
from torch import nn
from torch.nn.utils import parametrize, prune

import mha

pytestmark = pytest.mark.usefixtures("one_thread")

PATHS = pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])


def layer(h=4, **kwargs):
    return mha.MultiHeadAttention(16, h, dtype=torch.float64, **kwargs).eval()


def x64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_the_articles_example_gives_y_of_xs_shape_and_one_table_per_head():
    m = mha.MultiHeadAttention(d_model=32, h=4)
    y, w = m(torch.randn(2, 6, 32))
    assert y.shape == (2, 6, 32) and w.shape == (2, 4, 6, 6)
    assert (m.d_k, m.qkv.weight.shape, m.out.weight.shape) == (8, (96, 32), (32, 32))
    y, w = m(torch.randn(2, 6, 32), torch.randn(2, 9, 32))  # cross-attention: S = 9 keys
    assert y.shape == (2, 6, 32) and w.shape == (2, 4, 6, 9)


@PATHS
def test_self_attention_is_causal_by_default_and_cross_attention_is_not(need_weights):
    m, x, context = layer(), x64(2, 5, 16), x64(2, 7, 16)
    assert torch.equal(m(x, need_weights=need_weights)[0], m(x, causal=True, need_weights=need_weights)[0])
    assert not torch.equal(m(x, need_weights=need_weights)[0], m(x, causal=False, need_weights=need_weights)[0])
    assert torch.equal(m(x, context, need_weights=need_weights)[0],
                       m(x, context, causal=False, need_weights=need_weights)[0])


@pytest.mark.c8
@PATHS
def test_dropout_acts_in_training_and_never_in_eval(need_weights):
    """C8: with attention dropout 0.5, a module in eval() called twice on one input must return identical outputs."""
    m, x = mha.MultiHeadAttention(16, 4, dropout=0.5), torch.randn(2, 5, 16)
    without = mha.MultiHeadAttention(16, 4)  # the same weights, no dropout
    without.load_state_dict(m.state_dict())
    assert not torch.equal(m(x, need_weights=need_weights)[0], m(x, need_weights=need_weights)[0])
    m.eval()
    for _ in range(2):
        assert torch.equal(m(x, need_weights=need_weights)[0], without(x, need_weights=need_weights)[0])


# -- the head count in the checkpoint (C19) ------------------------------------------------------------------------


def saved(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.c19
def test_a_checkpoint_of_another_head_count_is_refused_naming_both():
    """C19: MultiHeadAttention(32, 8) loaded MultiHeadAttention(32, 4)'s state_dict without a word (same shapes for
    every h), and its outputs differed by 0.15."""
    source, target = mha.MultiHeadAttention(32, 4), mha.MultiHeadAttention(32, 8)
    before = [p.clone() for p in target.parameters()]
    for state in (source.state_dict(), saved(source.state_dict())):
        for strict in (True, False):
            with pytest.raises(ValueError, match=r"from a layer with h=4, but this layer has h=8.*make the layer "
                                                 r"with h=4"):
                target.load_state_dict(state, strict=strict)
    with pytest.raises(ValueError, match=r"h=4, but this layer has h=8"):  # inside a model too
        nn.Sequential(target).load_state_dict(nn.Sequential(source).state_dict())
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))  # nothing was copied
    same = mha.MultiHeadAttention(32, 4)
    same.load_state_dict(saved(source.state_dict()))
    x = torch.randn(2, 3, 32)
    assert torch.equal(same(x)[0], source(x)[0])


@pytest.mark.c19
@pytest.mark.parametrize("key", ["_extra_state", "head_config"], ids=["0.4", "0.3"])
def test_an_old_checkpoints_head_count_tensor_is_checked_and_dropped(key):
    """C19: mha 0.4 (``_extra_state``) and 0.3 (``head_config``) saved [h, n_kv_heads, d_k] as a tensor; those
    checkpoints still load, strictly, into their h, and are refused by another."""
    source = mha.MultiHeadAttention(32, 4)
    old = {**source.state_dict(), key: torch.tensor([4, 4, 8])}  # a plain dict: no metadata, as 0.4 saved
    target = mha.MultiHeadAttention(32, 4)
    result = target.load_state_dict(old, strict=True)
    assert result.missing_keys == result.unexpected_keys == []
    x = torch.randn(2, 3, 32)
    assert torch.equal(target(x)[0], source(x)[0])
    with pytest.raises(ValueError, match=r"from a layer with h=4, but this layer has h=8"):
        mha.MultiHeadAttention(32, 8).load_state_dict(old)


@pytest.mark.c19
@pytest.mark.c28
def test_a_state_dict_without_metadata_loads_unchecked_as_the_docs_say():
    """C19, C28: checkpoints saved by 0.2 record no head count and must still load; so does any dict that lost the
    metadata (a comprehension, safetensors), into any h: the docstring's caveat beside the head-count claim."""
    safetensors = pytest.importorskip("safetensors.torch")
    state = mha.MultiHeadAttention(32, 4).state_dict()
    for rebuilt in ({k: v for k, v in state.items()}, safetensors.load(safetensors.save(state))):
        target = mha.MultiHeadAttention(32, 8)
        assert target.load_state_dict(rebuilt).unexpected_keys == []
        assert torch.equal(target.qkv.weight, state["qkv.weight"])


# -- what PyTorch does to a module's tensors (C22, C23, C27, C28) ----------------------------------------------


def reset(m):
    for sub in m.modules():
        if hasattr(sub, "reset_parameters"):
            sub.reset_parameters()
    return m


def meta_to_empty(source):
    with torch.device("meta"):
        m = mha.MultiHeadAttention(16, 4)
    return reset(m.to_empty(device="cpu"))


def meta_assign(source):
    with torch.device("meta"):
        m = mha.MultiHeadAttention(16, 4)
    m.load_state_dict(source.state_dict(), assign=True)
    return m


DEFERRED = {"meta, to_empty, reset_parameters": meta_to_empty,
            "skip_init": lambda source: reset(torch.nn.utils.skip_init(mha.MultiHeadAttention, 16, 4)),
            "meta, load_state_dict(assign=True)": meta_assign}


@pytest.mark.c22
@pytest.mark.parametrize("recipe", DEFERRED.values(), ids=DEFERRED.keys())
def test_a_deferred_layer_computes_saves_and_loads_as_a_built_one(recipe):
    """C22: after meta-device init, to_empty() and reset_parameters() (or skip_init), the head count held
    uninitialised memory, so the layer's own checkpoint was refused ("a layer with h=1.40055e+14")."""
    source, x = mha.MultiHeadAttention(16, 4), torch.randn(2, 3, 16)
    m = recipe(source)
    assert not any(t.is_meta for t in m.state_dict().values())
    built = mha.MultiHeadAttention(16, 4)
    assert built.load_state_dict(saved(m.state_dict())).missing_keys == []
    assert torch.equal(built(x)[0], m(x)[0])
    m.load_state_dict(source.state_dict())
    assert torch.equal(m(x)[0], source(x)[0])
    with pytest.raises(ValueError, match=r"from a layer with h=4, but this layer has h=2"):  # C19 still holds
        mha.MultiHeadAttention(16, 2).load_state_dict(m.state_dict())


class Double(nn.Module):  # a parametrization: the weight the layer uses is twice the one it stores
    def forward(self, W):
        return 2 * W


def with_hook():
    m = layer()
    ref = copy.deepcopy(m)
    m.qkv.register_forward_hook(lambda module, args, out: 2 * out)
    with torch.no_grad():
        ref.qkv.weight.mul_(2), ref.qkv.bias.mul_(2)
    return m, ref


def with_parametrization():
    m = layer()
    ref = copy.deepcopy(m)
    parametrize.register_parametrization(m.qkv, "weight", Double())
    with torch.no_grad():
        ref.qkv.weight.mul_(2)
    return m, ref


def with_peft_lora():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(layer(), peft.LoraConfig(r=4, target_modules=["qkv", "out"], init_lora_weights=False))
    return model.base_model.model, copy.deepcopy(model).merge_and_unload()


WRAPPED = {"forward hook": with_hook, "parametrization": with_parametrization,
           "peft LoRA": pytest.param(with_peft_lora, marks=pytest.mark.slow)}  # importing peft takes seconds


@pytest.mark.c23
@pytest.mark.parametrize("wrap", WRAPPED.values(), ids=WRAPPED.keys())
def test_what_wraps_qkv_acts_in_cross_attention_on_both_paths(wrap):
    """C23: cross-attention called F.linear on qkv.weight itself, so a LoRA adapter on qkv left its output
    bit-identical to the base model's (0.44 from merge_and_unload()) and got no gradient."""
    m, merged = wrap()
    x, context = x64(2, 3, 16), x64(2, 5, 16)
    for need_weights in (True, False):
        for args in ((x,), (x, context)):
            assert_close(m(*args, need_weights=need_weights)[0], merged(*args, need_weights=need_weights)[0])
    m(x, context)[0].pow(2).sum().backward()
    trained = [p for p in m.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and p.grad.abs().max() > 0 for p in trained)


@pytest.mark.c23
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_a_dynamically_quantized_layer_runs_its_int8_projections_on_both_paths():
    """C23's kind: a path that reads qkv.weight itself breaks on a quantized qkv, whose weight is a method."""
    m = mha.MultiHeadAttention(16, 4).eval()
    quantized = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
    x, context = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    for need_weights in (True, False):
        for args in ((x,), (x, context)):
            y, y_float = quantized(*args, need_weights=need_weights)[0], m(*args, need_weights=need_weights)[0]
            assert 0 < (y - y_float).abs().max() < 0.05  # int8 weights and activations: close, not equal


REPARAMETRIZED = {
    "weight_norm": lambda q: torch.nn.utils.weight_norm(q),
    "spectral_norm": lambda q: torch.nn.utils.spectral_norm(q),
    "pruning": lambda q: prune.l1_unstructured(q, "weight", amount=0.5),
}


@pytest.mark.c27
@pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")
@pytest.mark.parametrize("apply", REPARAMETRIZED.values(), ids=REPARAMETRIZED.keys())
def test_a_reparametrized_qkv_then_double_runs_as_its_linear_computes_it(apply):
    """C27: after weight_norm, spectral_norm or pruning, then .double(), the layer refused a float64 x ("x is
    torch.float64 but the module's parameters are torch.float32"), reading qkv.weight before qkv's hook ran."""
    m = mha.MultiHeadAttention(16, 4)
    apply(m.qkv)
    m = m.double().eval()
    x = x64(2, 5, 16)
    y, _ = m(x)
    plain = layer()  # the weights the hooks computed, in a layer without them
    plain.load_state_dict({"qkv.weight": m.qkv.weight, "qkv.bias": m.qkv.bias, **m.out.state_dict(prefix="out.")})
    assert y.dtype == torch.float64
    assert_close(y, plain(x)[0])


@pytest.mark.c27
def test_a_dtype_mismatch_is_left_to_the_submodule_that_meets_it():
    """C27: the layer checks its inputs, never its submodules' state; nn.Linear says what is wrong, when it runs."""
    m, x = mha.MultiHeadAttention(16, 4), x64(2, 5, 16)
    with pytest.raises(RuntimeError) as linear:
        m.qkv(x)
    with pytest.raises(RuntimeError) as ours:
        m(x)
    assert str(ours.value) == str(linear.value)


@pytest.mark.c28
def test_torch_func_and_safetensors_take_the_layers_own_state_dict():
    """C28: torch.func.functional_call(m, m.state_dict(), (x,), strict=True) raised "Unexpected key(s):
    '_extra_state'"; what the layer stores beside its weights must break no state-dict workflow of PyTorch's."""
    safetensors = pytest.importorskip("safetensors.torch")
    layers, x = [layer() for _ in range(3)], x64(2, 5, 16)
    m = layers[0]
    y, w = torch.func.functional_call(m, layers[1].state_dict(), (x,), strict=True)
    assert torch.equal(y, layers[1](x)[0]) and torch.equal(w, layers[1](x)[1])
    params, buffers = torch.func.stack_module_state(layers)  # the torch.func ensembling tutorial
    ys = torch.func.vmap(lambda p, b: torch.func.functional_call(m, (p, b), (x,))[0])(params, buffers)
    assert_close(ys, torch.stack([one(x)[0] for one in layers]))
    back = layer()
    back.load_state_dict(safetensors.load(safetensors.save(m.state_dict())))
    assert torch.equal(back(x)[0], m(x)[0])


def test_a_deepcopied_or_pickled_layer_computes_the_same_and_owns_its_weights():
    m, x = layer(), x64(2, 5, 16)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(other(x)[0], m(x)[0])
        with torch.no_grad():
            other.qkv.weight.zero_()
        assert m.qkv.weight.abs().max() > 0


# -- padding, NaN and fully masked samples (C4, C14) ----------------------------------------------------------


@pytest.mark.c14
@PATHS
@pytest.mark.parametrize("causal", [True, False])
def test_nan_in_padded_rows_of_x_leaves_the_real_tokens_as_without_them(causal, need_weights):
    """C14: an upstream layer leaves NaN on padded rows (pytorch/pytorch#41508); with a (B, S) padding mask the
    real tokens' outputs must be finite and equal to those without the padded rows."""
    m, lengths = layer(), [6, 4]
    x = x64(2, 6, 16)
    x[1, 4:] = float("nan")
    keep = mha.padding_mask(lengths)[:, None, None, :]
    y, _ = m(x, mask=keep, causal=causal, need_weights=need_weights)
    for b, n in enumerate(lengths):
        assert_close(y[b, :n], m(x[b : b + 1, :n], causal=causal, need_weights=need_weights)[0][0])


@pytest.mark.c4
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_fully_masked_sample_poisons_nothing_on_either_path(train):
    """C4: the second sample's keys all masked (a padded sample) gave NaN, which reached the first sample's
    gradients; the answer must not depend on need_weights or train/eval mode."""
    m = mha.MultiHeadAttention(8, 2, dropout=0.1).train(train)
    x = torch.randn(2, 4, 8, requires_grad=True)
    keep = mha.padding_mask([4, 0])[:, None, None, :]
    ys = []
    for need_weights in (True, False):
        y, w = m(x, mask=keep, need_weights=need_weights)
        assert torch.equal(y[1], m.out.bias.expand(4, 8))  # no key: zero attention output, then W_O's bias
        assert w is None or not w[1].any()
        (grad,) = torch.autograd.grad(y[0].sum(), x)
        assert grad.isfinite().all() and not grad[1].any()
        ys.append(y)
    if not train:
        assert_close(ys[0][:1], m(x[:1])[0], atol=1e-6)  # the first sample, as if alone
        assert_close(ys[1], ys[0], atol=1e-6)


# -- compile and autocast (C10, C11) ----------------------------------------------------------------------------


@pytest.mark.c10
@pytest.mark.slow
@PATHS
def test_the_layer_compiled_with_dynamic_shapes_equals_eager(need_weights):
    """C10: logic on sequence lengths written as plain Python values breaks when compile makes them symbolic."""
    torch.compiler.reset()
    m = mha.MultiHeadAttention(16, 4).eval()
    f = torch.compile(m, backend="eager", fullgraph=True, dynamic=True)
    for T in (7, 11):
        x = torch.randn(2, T, 16)
        (y, w), (y_ref, w_ref) = f(x, need_weights=need_weights), m(x, need_weights=need_weights)
        assert_close(y, y_ref, atol=1e-6)
        if need_weights:
            assert_close(w, w_ref, atol=1e-6)
        else:
            assert w is None
    torch.compiler.reset()


@pytest.mark.c11
@PATHS
def test_two_stacked_layers_under_bfloat16_autocast_stay_as_close_as_pytorchs(need_weights):
    """C11: under torch.autocast the first layer hands the second bfloat16 activations, which the second refused;
    it must run forward and backward within 2e-2 of float32, as nn.MultiheadAttention's stack does."""
    ours = [mha.MultiHeadAttention(16, 4), mha.MultiHeadAttention(16, 4)]
    theirs = [mha.to_torch(m) for m in ours]
    x, blocked = torch.randn(2, 5, 16), mha.to_torch_attn_mask(mha.causal_mask(5))

    def stack(run, layers, autocast):
        x_ = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = run(run(x_, layers[0]), layers[1])
        return y.float(), torch.autograd.grad(y.float().square().sum(), [x_, *layers[0].parameters()])

    def mha_layer(y, m):
        return m(y, need_weights=need_weights)[0]

    def torch_layer(y, t):
        return t(y, y, y, attn_mask=blocked)[0]

    (y32, grads32), (y16, grads16) = stack(mha_layer, ours, False), stack(mha_layer, ours, True)
    theirs32, theirs16 = stack(torch_layer, theirs, False)[0], stack(torch_layer, theirs, True)[0]
    gap, torch_gap = (y16 - y32).abs().max(), (theirs16 - theirs32).abs().max()
    assert gap < 2e-2 and gap < 2 * torch_gap
    for g16, g32 in zip(grads16, grads32):
        assert_close(g16, g32, atol=2e-2 * g32.abs().max().item())
