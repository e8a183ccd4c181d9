"""Cases C22 and C23 (/work/shared/cases/attention-cases.md): what a layer holds, and how it calls what it holds.

C22: every deferred-initialisation recipe that works for ``nn.MultiheadAttention`` works for the layer, and its
checkpoints load; C19 (a checkpoint of other head counts is refused) still holds. C23: ``qkv`` and ``out`` run as
modules on every path, so whatever wraps them acts on every path; a path that copies their weights instead refuses
a wrapped one, naming itself.
"""

import copy
import io
import warnings

import pytest
import torch
from helpers import assert_close
from torch import nn
from torch.nn.utils import parametrize, prune

import mha

# -- C22: deferred initialisation ------------------------------------------------------------------------------

KINDS = {  # (class, args, kwargs): the layer, and PyTorch's, of the same sizes
    "mha": (mha.MultiHeadAttention, (16, 4), {}),
    "nn.MultiheadAttention": (nn.MultiheadAttention, (16, 4), {"batch_first": True}),
}


def call(m, x):
    if isinstance(m, mha.MultiHeadAttention):
        return m(x, causal=False, need_weights=False)[0]
    return m(x, x, x, need_weights=False)[0]


def reset(m):
    """Initialise the parameters again, as FSDP's meta-device recipe and torchtitan's init_weights do."""
    for sub in m.modules():
        init = getattr(sub, "reset_parameters", None) or getattr(sub, "_reset_parameters", None)
        if init is not None:
            init()


def meta_then_to_empty(cls, args, kwargs, checkpoint):
    with torch.device("meta"):
        m = cls(*args, **kwargs)
    m.to_empty(device="cpu")
    reset(m)
    return m


def skip_init(cls, args, kwargs, checkpoint):
    m = torch.nn.utils.skip_init(cls, *args, **kwargs)  # built on the meta device, then to_empty()
    reset(m)
    return m


def meta_then_assign(cls, args, kwargs, checkpoint):
    with torch.device("meta"):
        m = cls(*args, **kwargs)
    m.load_state_dict(checkpoint, assign=True)  # the checkpoint's tensors become the parameters
    return m


RECIPES = {"meta, to_empty, reset_parameters": meta_then_to_empty, "skip_init": skip_init,
           "meta, load_state_dict(assign=True)": meta_then_assign}


def round_trips(state):
    """A state_dict as it comes back from the ways checkpoints are kept."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    trips = {"as is": state, "torch.save": torch.load(buffer), "dict()": dict(state),
             "prefix stripped": {k.removeprefix("module."): v for k, v in {f"module.{k}": v for k, v in state.items()}
                                 .items()}}
    safetensors = pytest.importorskip("safetensors.torch")
    trips["safetensors"] = safetensors.load(safetensors.save(state))
    return trips


@pytest.mark.parametrize("recipe", RECIPES.values(), ids=RECIPES.keys())
@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_C22_a_deferred_layer_computes_saves_and_loads_as_a_built_one(kind, recipe):
    cls, args, kwargs = kind
    torch.manual_seed(0)
    source = cls(*args, **kwargs).eval()
    m = recipe(cls, args, kwargs, source.state_dict()).eval()
    x = torch.randn(2, 3, 16)
    for step in ("as made", ".to(float64)", ".to('cpu')"):
        if step == ".to(float64)":
            m, source, x = m.to(torch.float64), source.double(), x.double()
        elif step == ".to('cpu')":
            m = m.to("cpu")
        # Its checkpoint, however it was kept, loads into a layer built as usual, which then computes the same.
        for trip, state in round_trips(m.state_dict()).items():
            built = cls(*args, **kwargs, dtype=x.dtype).eval()
            result = built.load_state_dict(state)
            assert result.missing_keys == [] and result.unexpected_keys == [], (step, trip)
            assert torch.equal(call(built, x), call(m, x)), (step, trip)
        # And it loads a checkpoint of a layer built as usual.
        m.load_state_dict(source.state_dict())
        assert torch.equal(call(m, x), call(source, x)), step


@pytest.mark.parametrize("recipe", RECIPES.values(), ids=RECIPES.keys())
def test_C22_a_deferred_layer_saves_its_own_head_counts_and_c19_still_holds(recipe):
    # The fault: head_config, a buffer, held uninitialised memory after to_empty() and skip_init, so the
    # layer's own checkpoint was refused ("from a layer with h=1.40055e+14 ...").
    torch.manual_seed(0)
    source = mha.MultiHeadAttention(16, 4, n_kv_heads=2)
    m = recipe(mha.MultiHeadAttention, (16, 4), {"n_kv_heads": 2}, source.state_dict())
    state = m.state_dict()
    assert state["_extra_state"].dtype == torch.int64 and state["_extra_state"].tolist() == [4, 2, 4]
    assert list(state) == ["_extra_state", "qkv.weight", "qkv.bias", "out.weight", "out.bias"]
    assert not any(t.is_meta for t in state.values())  # nothing the layer holds was left unset
    for saved in round_trips(state).values():
        for other in (mha.MultiHeadAttention(16, 4, n_kv_heads=4, d_k=4), mha.MultiHeadAttention(16, 4)):
            with pytest.raises(ValueError, match=r"from a layer with h=4, n_kv_heads=2, d_k=4, but this layer has "
                                                 r"h=4, n_kv_heads=4"):
                other.load_state_dict(saved)
    # What a deferred layer holds beside its weights: nothing. nn.MultiheadAttention holds no buffer either.
    assert list(m.buffers()) == [] and list(nn.MultiheadAttention(16, 4).buffers()) == []


def test_C22_a_layer_on_the_meta_device_saves_real_head_counts_and_loads_with_assign():
    with torch.device("meta"):
        m = mha.MultiHeadAttention(16, 4)
    assert m.state_dict()["_extra_state"].tolist() == [4, 4, 4] and m.qkv.weight.is_meta
    source = mha.MultiHeadAttention(16, 4)
    m.load_state_dict(source.state_dict(), assign=True)
    x = torch.randn(2, 3, 16)
    assert not m.qkv.weight.is_meta and torch.equal(m(x)[0], source(x)[0])
    with torch.device("meta"):
        other = mha.MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match=r"from a layer with h=4, n_kv_heads=4, d_k=4, but this layer has h=2"):
        other.load_state_dict(source.state_dict(), assign=True)
    assert other.qkv.weight.is_meta  # refused before anything was assigned


# -- C23: every submodule called as a module -------------------------------------------------------------------


def layer(n_kv_heads=2):
    torch.manual_seed(0)
    return mha.MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, dtype=torch.float64).eval()


class LoRALinear(nn.Module):
    """A low-rank adapter around a Linear, as peft's LoRA builds one (Hu et al. 2021): base(x) + s x A^T B^T."""

    def __init__(self, base: nn.Linear, r: int = 2, s: float = 0.5):
        super().__init__()
        self.base, self.s = base, s
        self.A = nn.Parameter(torch.randn(r, base.in_features, dtype=base.weight.dtype) / 4)
        self.B = nn.Parameter(torch.randn(base.out_features, r, dtype=base.weight.dtype) / 4)

    def forward(self, x):
        return self.base(x) + self.s * (x @ self.A.T) @ self.B.T

    def merged(self) -> torch.Tensor:
        return self.base.weight + self.s * self.B @ self.A


class Scale(nn.Module):  # a parametrization: the weight the layer uses is twice the one it stores
    def forward(self, W):
        return 2 * W


def with_hook(n_kv_heads=2):
    m, ref = layer(n_kv_heads), layer(n_kv_heads)
    m.qkv.register_forward_hook(lambda module, args, out: 2 * out)
    m.out.register_forward_pre_hook(lambda module, args: (args[0] / 2,))
    with torch.no_grad():
        ref.qkv.weight.mul_(2), ref.qkv.bias.mul_(2), ref.out.weight.div_(2)
    return m, ref


def with_parametrization(n_kv_heads=2):
    m, ref = layer(n_kv_heads), layer(n_kv_heads)
    parametrize.register_parametrization(m.qkv, "weight", Scale())
    with torch.no_grad():
        ref.qkv.weight.mul_(2)
    return m, ref


def with_pruning(n_kv_heads=2):
    m, ref = layer(n_kv_heads), layer(n_kv_heads)
    prune.l1_unstructured(m.qkv, "weight", amount=0.5)  # weight = weight_orig * weight_mask, set by a pre-hook
    with torch.no_grad():
        m.qkv.weight_orig.add_(1.0)  # the hook recomputes the weight at the next call
        ref.qkv.weight.copy_(m.qkv.weight_orig * m.qkv.weight_mask)
    return m, ref


def with_lora(n_kv_heads=2):
    m, ref = layer(n_kv_heads), layer(n_kv_heads)
    m.qkv, m.out = LoRALinear(m.qkv), LoRALinear(m.out)
    with torch.no_grad():
        ref.qkv.weight.copy_(m.qkv.merged()), ref.out.weight.copy_(m.out.merged())
    return m, ref


def with_peft_lora():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(layer(), peft.LoraConfig(r=4, target_modules=["qkv", "out"], init_lora_weights=False))
    return model.base_model.model, copy.deepcopy(model).merge_and_unload()


WRAPPERS = {"forward hooks": with_hook, "parametrization": with_parametrization, "pruning": with_pruning,
            "LoRA module": with_lora, "peft LoRA": with_peft_lora}


def paths(m, x, context, pad):
    """Every way through the layer: (name, what it returns)."""
    cache = mha.KVCache()
    decoded = torch.cat([m(x[:, :2], cache=cache)[0], m(x[:, 2:], cache=cache)[0]], dim=1)
    return {
        "self-attention, weights": m(x),
        "self-attention, fused": m(x, need_weights=False),
        "cross-attention, weights": m(x, context, mask=pad),
        "cross-attention, fused": m(x, context, mask=pad, need_weights=False),
        "project, cross": m.project(x, context),
        "decoding with a KVCache": (decoded,),
    }


@pytest.mark.parametrize("wrap", WRAPPERS.values(), ids=WRAPPERS.keys())
def test_C23_what_wraps_qkv_and_out_acts_on_every_path(wrap):
    # The fault: cross-attention split qkv.weight and called F.linear itself, so qkv's forward, its hooks and
    # whatever wrapped it never ran there: a LoRA adapter left the output unchanged (0.44 from the merged
    # weights) and got no gradient.
    m, ref = wrap()
    x, context = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    pad = mha.padding_mask([5, 3])[:, None, None, :]
    wrapped, merged = paths(m, x, context, pad), paths(ref, x, context, pad)
    plain = paths(layer(), x, context, pad)
    for name in wrapped:
        for got, want, before in zip(wrapped[name], merged[name], plain[name]):
            if want is not None:
                assert_close(got, want, atol=1e-12, where=name)
                assert (got - before).abs().max() > 1e-3, name  # the wrapper does change this path's numbers


def test_C23_an_adapter_on_qkv_learns_from_cross_attention():
    m = layer()
    m.qkv = LoRALinear(m.qkv)
    x, context = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    m(x, context)[0].pow(2).sum().backward()
    assert m.qkv.A.grad.abs().min() > 0 and m.qkv.B.grad[:4].abs().min() > 0  # B's W_Q rows: from x
    assert m.qkv.B.grad[8:].abs().min() > 0  # its W_K and W_V rows: from the context


def test_C23_a_hook_on_qkv_sees_both_sequences_of_cross_attention():
    m, seen = layer(), []
    m.qkv.register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    m(torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64))
    assert seen == [(2, 3, 16), (2, 5, 16)]  # x for the queries, the context for the keys and values


def test_C23_dynamic_quantization_acts_on_cross_attention():
    ao = pytest.importorskip("torch.ao.quantization")
    torch.manual_seed(0)
    m = mha.MultiHeadAttention(16, 4).eval()
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao: it still works
        warnings.simplefilter("ignore")
        q = ao.quantize_dynamic(copy.deepcopy(m), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, 3, 16)
    # Cross-attention to x itself runs the same quantized modules on the same rows as self-attention.
    assert torch.equal(q(x, x)[0], q(x, causal=False)[0])
    assert 0 < (q(x, x)[0] - m(x, x)[0]).abs().max() < 0.05  # quantized, and close to the float layer


@pytest.mark.parametrize("wrap", [with_hook, with_pruning, with_lora], ids=["hooks", "pruning", "LoRA module"])
def test_C23_the_paths_that_copy_weights_refuse_a_wrapped_submodule_and_say_so(wrap):
    m, _ = wrap(n_kv_heads=None)  # one K/V head per query head, as nn.MultiheadAttention has
    refused = r"from_heads copies the weights of qkv instead of calling it, so it cannot apply what wraps it: qkv "
    with pytest.raises(ValueError, match=r"MultiHeadAttention\." + refused + "(has forward hooks|is a )"):
        mha.MultiHeadAttention.from_heads(m, [0, 1])
    with pytest.raises(ValueError, match=r"mha.to_torch copies the weights of qkv instead of calling it"):
        mha.to_torch(m)


def test_C23_a_parametrized_layer_copies_the_weights_it_computes():
    m, ref = with_parametrization()
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    part, ref_part = mha.MultiHeadAttention.from_heads(m, [2, 3]), mha.MultiHeadAttention.from_heads(ref, [2, 3])
    assert_close(part(x)[0], ref_part(x)[0], atol=1e-12)
