"""The layer against the attention people know: ``nn.MultiheadAttention``, ``F.scaled_dot_product_attention`` and
Hugging Face's attention modules, with the same weights, in float64 (1e-10) and float32 (1e-5).

``mha.to_torch`` and ``mha.from_torch`` (mha/interop.py) copy the weights; ``nn.MultiheadAttention`` is then called
with the mask in its own convention (True = blocked), per-head weights unaveraged. The Hugging Face modules are
built from tiny configs with random weights (nothing is downloaded), their weights copied here by hand.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, sdpa_reference, torch_reference
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import mha

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = [  # d_model, h, B, T, S (None: self-attention, causal by default)
    (12, 4, 2, 5, None),  # case C6's sizes: B=2, h=4, T=5, d_k=3
    (32, 1, 1, 5, None),
    (12, 12, 3, 4, None),
    (24, 3, 2, 7, 4),
    (16, 2, 1, 1, 9),
]


@pytest.mark.c6
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("d_model, h, B, T, S", CONFIGS)
def test_both_paths_equal_nn_multiheadattention_and_sdpa(d_model, h, B, T, S, bias, dtype):
    """C6: merging (B, h, T, d_k) heads without the transpose ran and mixed heads with time steps (max error ~3)."""
    m = mha.MultiHeadAttention(d_model, h, bias=bias, dtype=dtype)
    x = torch.randn(B, T, d_model, dtype=dtype)
    context = None if S is None else torch.randn(B, S, d_model, dtype=dtype)
    keep = mha.causal_mask(T) if context is None else None
    y_ref, w_ref = torch_reference(m, x, context, keep)
    y, w = m(x, context)
    assert_close(y, y_ref)
    assert_close(w, w_ref)
    y_fused, _ = m(x, context, need_weights=False)
    assert_close(y_fused, sdpa_reference(m, x, context, keep))


@pytest.mark.parametrize("kind", [mha.MultiHeadAttention, mha.GroupedQueryAttention])
@pytest.mark.parametrize("B, T, S", [(0, 3, None), (2, 0, None), (2, 3, 0)], ids=["no sample", "no query", "no key"])
def test_empty_batches_queries_and_keys_give_what_nn_multiheadattention_gives(B, T, S, kind):
    m = kind(8, 2, dtype=torch.float64)
    x = torch.randn(B, T, 8, dtype=torch.float64)
    context = None if S is None else torch.randn(B, S, 8, dtype=torch.float64)
    y_ref, w_ref = torch_reference(m, x, context, mha.causal_mask(T) if S is None else None)
    for need_weights in (True, False):
        y, w = m(x, context, need_weights=need_weights)
        assert_close(y, y_ref)
        assert w is None or w.shape == w_ref.shape


@st.composite
def masked_cases(draw):
    h, d_k, B, T = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    S = draw(st.integers(1, 5)) if draw(st.booleans()) else None
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    L = T if S is None else S
    shape = draw(st.sampled_from(["padding", (T, L), (B, 1, 1, L), (B, h, T, L), (1, h, 1, L)]))
    if shape == "padding":
        keep = mha.padding_mask(torch.randint(1, L + 1, (B,), generator=g), L)[:, None, None, :]
    else:
        keep = torch.rand(shape, generator=g) > 0.4
        keep[..., 0] = True  # nn.MultiheadAttention gives NaN where a row has no key: tests/test_attention.py's
    causal = S is None and draw(st.booleans())
    return h * d_k, h, B, T, S, keep, causal, g


@given(masked_cases())
def test_masks_padding_and_cross_attention_equal_nn_multiheadattention(case):
    d_model, h, B, T, S, keep, causal, g = case
    m = mha.MultiHeadAttention(d_model, h, dtype=torch.float64)
    x = torch.randn(B, T, d_model, generator=g, dtype=torch.float64)
    context = None if S is None else torch.randn(B, S, d_model, generator=g, dtype=torch.float64)
    intent = keep & mha.causal_mask(T) if causal else keep
    y_ref, w_ref = torch_reference(m, x, context, intent)
    for need_weights in (True, False):
        y, w = m(x, context, causal=causal, mask=keep, need_weights=need_weights)
        assert_close(y, y_ref)
        if need_weights:
            assert_close(w, w_ref)


@pytest.mark.c1
def test_a_keep_mask_converted_for_nn_multiheadattention_means_the_same():
    """C1: a boolean tril mask handed straight to nn.MultiheadAttention (True = blocked) attends to the future and
    makes the last query row NaN; to_torch_attn_mask converts it, and row 0 of the causal weights is [1, 0, 0, 0]."""
    m, x, tril = mha.MultiHeadAttention(8, 2), torch.randn(1, 4, 8), torch.ones(4, 4).tril().bool()
    ref = mha.to_torch(m)
    _, w_raw = ref(x, x, x, attn_mask=tril, average_attn_weights=False)
    assert w_raw[0, :, 3].isnan().all()  # the fault, as PyTorch reads the raw mask
    y, w = m(x, mask=tril, causal=False)
    y_ref, w_ref = ref(x, x, x, attn_mask=mha.to_torch_attn_mask(tril), average_attn_weights=False)
    assert_close(y, y_ref, atol=1e-6)
    assert_close(w, w_ref, atol=1e-6)
    assert w[0, :, 0].tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2


def test_an_additive_mask_means_to_pytorch_what_the_keep_mask_means_to_mha():
    q, k, v = (torch.randn(2, 3, 4, 5, dtype=torch.float64) for _ in range(3))
    keep = torch.rand(4, 4) > 0.4
    keep[:, 0] = True
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mha.to_additive_mask(keep, dtype=torch.float64))
    assert_close(mha.scaled_dot_product_attention(q, k, v, keep)[0], expected)


@pytest.mark.c9
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("bias", [True, False])
def test_weights_copied_to_pytorch_and_back_give_the_same_layer(dtype, tol, bias):
    """C9: in_proj_weight is [W_Q; W_K; W_V] in nn.Linear's (out, in) layout; K, Q, V order, transposed blocks or
    rows interleaved per head all ran and gave silently wrong outputs."""
    m = mha.MultiHeadAttention(16, 4, bias=bias, dropout=0.25, dtype=dtype).eval()
    ref = mha.to_torch(m)
    back = mha.from_torch(ref)
    assert (back.dropout, back.training, ref.dropout, ref.training) == (0.25, False, 0.25, False)
    assert list(back.state_dict()) == list(m.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), m.state_dict().values()))
    x = torch.randn(2, 5, 16, dtype=dtype)
    y_ref, w_ref = ref(x, x, x, attn_mask=mha.to_torch_attn_mask(mha.causal_mask(5)), average_attn_weights=False)
    assert_close(m(x)[0], y_ref, atol=tol)
    assert_close(m(x)[1], w_ref, atol=tol)


@pytest.mark.c9
@pytest.mark.parametrize("batch_first", [True, False])
def test_a_pytorch_module_copied_in_computes_as_it_did(batch_first):
    """C9: from_torch of any nn.MultiheadAttention, batch-first or not, keeps its exact weights and frozen flags."""
    ref = nn.MultiheadAttention(12, 3, batch_first=batch_first).double()
    ref.in_proj_weight.requires_grad_(False)
    m = mha.from_torch(ref)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    xs = x if batch_first else x.transpose(0, 1)
    y_ref, w_ref = ref(xs, xs, xs, average_attn_weights=False)
    y, w = m(x, causal=False)
    assert_close(y, y_ref if batch_first else y_ref.transpose(0, 1), atol=1e-12)
    assert_close(w, w_ref, atol=1e-12)
    assert [p.requires_grad for p in m.parameters()] == [p.requires_grad for p in ref.parameters()]


@pytest.mark.parametrize("h", [1, 4, 16])
def test_the_parameter_count_is_nn_multiheadattentions_whatever_h(h):
    """Notebook 02's "what h costs": 4 d_model^2 weights and 4 d_model biases for any h."""
    ours = mha.count_parameters(mha.MultiHeadAttention(32, h))
    assert ours == mha.count_parameters(nn.MultiheadAttention(32, h)) == (4 * 32 * 32, 4 * 32, 4 * 32 * 32 + 4 * 32)
    assert mha.count_parameters(nn.MultiheadAttention(8, 2, add_bias_kv=True)).biases == 3 * 8 + 8 + 2 * 8


# -- Hugging Face transformers, tiny random configs ------------------------------------------------------------

B, T, LENGTHS = 2, 6, [6, 4]  # sample 1 is right-padded: its last 2 tokens are padding


def hf_mask(causal, padded):
    """What a transformers model hands its attention layers: (B, 1, T, S), 0 = attend, the dtype's min = blocked."""
    keep = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        keep &= torch.ones(T, T, dtype=torch.bool).tril()
    if padded:
        keep &= (torch.arange(T) < torch.tensor(LENGTHS)[:, None])[:, None, None, :]
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)


def randomize(module):
    """Random weights and biases of a visible size (the default init makes biases zero), in float64."""
    module.double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return module


def copy_in(m, q, k, v, o, bias=True):
    """Copies the Linear-layout weights (out, in) of W_Q, W_K, W_V and W_O into m."""
    with torch.no_grad():
        m.qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        m.out.weight.copy_(o.weight)
        if bias:
            m.qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
            m.out.bias.copy_(o.bias)


@pytest.mark.slow  # importing transformers takes seconds
@pytest.mark.parametrize("padded", [False, True], ids=["causal", "causal+padding"])
def test_gpt2_attention(padded):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = transformers.GPT2Config(n_embd=24, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0, attn_implementation="eager")
    ref = randomize(GPT2Attention(config, layer_idx=0))
    m = mha.MultiHeadAttention(24, 4, dtype=torch.float64).eval()
    with torch.no_grad():  # Conv1D keeps (in, out): its columns [Q | K | V] are our rows [W_Q; W_K; W_V]
        m.qkv.weight.copy_(ref.c_attn.weight.T), m.qkv.bias.copy_(ref.c_attn.bias)
        m.out.weight.copy_(ref.c_proj.weight.T), m.out.bias.copy_(ref.c_proj.bias)
    x = torch.randn(B, T, 24, dtype=torch.float64)
    y_ref, w_ref = ref(x, attention_mask=hf_mask(causal=True, padded=padded))
    y, w = m(x, mask=mha.padding_mask(LENGTHS, T)[:, None, None, :] if padded else None)
    assert_close(y, y_ref, atol=1e-12)
    assert_close(w, w_ref, atol=1e-12)


@pytest.mark.slow
def test_bert_attention_bidirectional_with_padding():
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertAttention

    config = transformers.BertConfig(hidden_size=16, num_attention_heads=4, attention_probs_dropout_prob=0.0,
                                     hidden_dropout_prob=0.0, attn_implementation="eager")
    ref = randomize(BertAttention(config))  # self-attention, then dense (W_O), residual and LayerNorm
    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64).eval()
    copy_in(m, ref.self.query, ref.self.key, ref.self.value, ref.output.dense)
    x = torch.randn(B, T, 16, dtype=torch.float64)
    y_ref, w_ref = ref(x, attention_mask=hf_mask(causal=False, padded=True))
    y, w = m(x, mask=mha.padding_mask(LENGTHS, T)[:, None, None, :], causal=False)
    assert_close(ref.output.LayerNorm(y + x), y_ref, atol=1e-12)  # BERT's residual and LayerNorm follow W_O
    assert_close(w, w_ref, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [8, 12], ids=["head_dim=d_model/h", "head_dim=12"])
@pytest.mark.parametrize("bias", [False, True])
def test_llama_attention_with_grouped_query_heads(bias, head_dim):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention

    # 4 query heads share 2 K/V heads; head_dim=12 makes the heads 48 wide in a 32-wide model (Gemma-style).
    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                                      attention_bias=bias, attention_dropout=0.0, attn_implementation="eager")
    ref = randomize(LlamaAttention(config, layer_idx=0))
    m = mha.GroupedQueryAttention(32, 4, 2, d_k=head_dim, bias=bias, dtype=torch.float64).eval()
    copy_in(m, ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj, bias)
    assert mha.count_parameters(m) == mha.count_parameters(ref)
    x = torch.randn(B, T, 32, dtype=torch.float64)
    # RoPE is applied outside attention: neutralised here (cos = 1, sin = 0).
    no_rotation = (torch.ones(B, T, head_dim, dtype=torch.float64), torch.zeros(B, T, head_dim, dtype=torch.float64))
    y_ref, w_ref = ref(x, position_embeddings=no_rotation, attention_mask=hf_mask(causal=True, padded=False))
    y, w = m(x)
    # Llama's eager attention runs its softmax in float32 even for float64 inputs: float32-close, not float64-close.
    assert_close(y, y_ref, atol=1e-5)
    assert_close(w, w_ref, atol=1e-5)
