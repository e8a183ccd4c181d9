"""Conformance with the attention people know: Hugging Face transformers modules (issue 12).

Each test builds a transformers attention module from a tiny config with random weights (nothing is
downloaded), copies its weights into mha.MultiHeadAttention, and compares outputs and per-head weights
in float64. The weight copying lives here, not in the library: each model keeps parts of attention
outside its attention module (Llama's rotary embedding, BERT's residual and LayerNorm), so a general
converter would hand back a layer that only looks equivalent.

Masks: inside a transformers model, the attention module receives an additive (B, 1, T, S) mask that the
model built (0 = attend, the dtype's minimum = blocked). The tests build it from first principles, not with
mha's own converters.
"""

import pytest
import torch
from helpers import assert_close

import mha

transformers = pytest.importorskip("transformers", reason="the conformance tests need transformers (the test extra)")
from transformers.models.bert.modeling_bert import BertAttention  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention  # noqa: E402

B, T, LENGTHS = 2, 6, [6, 4]  # sample 1 is right-padded: its last 2 tokens are padding


def additive_mask(causal, padded):
    """What a transformers model hands its attention layers: (B, 1, T, S), 0 = attend, min = blocked."""
    keep = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        keep &= torch.ones(T, T, dtype=torch.bool).tril()
    if padded:
        keep &= (torch.arange(T) < torch.tensor(LENGTHS)[:, None])[:, None, None, :]
    blocked = torch.zeros(keep.shape, dtype=torch.float64)
    return blocked.masked_fill(~keep, torch.finfo(torch.float64).min), keep


def randomize(module):
    """Random weights and biases of a visible size (default inits make biases zero), in float64."""
    module.double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return module


def assert_conforms(y, w, y_ref, w_ref, tol):
    assert_close(y, y_ref, atol=tol)
    assert w.shape == w_ref.shape  # (B, h, T, S): one table per head, not averaged
    assert_close(w, w_ref, atol=tol)


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "causal+padding"])
def test_matches_gpt2_attention_with_its_weights(padded):
    config = transformers.GPT2Config(n_embd=24, n_head=4, n_layer=1, attn_pdrop=0.0, resid_pdrop=0.0,
                                     attn_implementation="eager")
    ref = randomize(GPT2Attention(config, layer_idx=0))
    m = mha.MultiHeadAttention(24, 4, dtype=torch.float64).eval()
    with torch.no_grad():
        # GPT-2's Conv1D stores its weight as (in, out), transposed relative to nn.Linear's (out, in).
        # c_attn's output columns are [Q | K | V], so its transpose is our [W_Q; W_K; W_V].
        m.qkv.weight.copy_(ref.c_attn.weight.T)
        m.qkv.bias.copy_(ref.c_attn.bias)
        m.out.weight.copy_(ref.c_proj.weight.T)
        m.out.bias.copy_(ref.c_proj.bias)
    x = torch.randn(B, T, 24, dtype=torch.float64)
    additive, _ = additive_mask(causal=True, padded=padded)
    y_ref, w_ref = ref(x, attention_mask=additive)
    keep = mha.padding_mask(LENGTHS, T)[:, None, None, :] if padded else None
    y, w = m(x, mask=keep)  # causal by default
    assert_conforms(y, w, y_ref, w_ref, tol=1e-12)


@pytest.mark.parametrize("head_dim", [8, 12], ids=["head_dim=d_model/h", "head_dim=12"])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_llama_attention_with_grouped_query_heads(bias, head_dim):
    # 4 query heads share 2 K/V heads. RoPE is applied outside mha, so it is neutralised: cos = 1, sin = 0.
    # head_dim=12 makes the heads 48 wide in a 32-wide model (Gemma-style), mha's explicit d_k.
    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=head_dim, attention_bias=bias, attention_dropout=0.0,
                                      attn_implementation="eager")
    ref = randomize(LlamaAttention(config, layer_idx=0))
    m = mha.MultiHeadAttention(32, 4, n_kv_heads=2, d_k=head_dim, bias=bias, dtype=torch.float64).eval()
    with torch.no_grad():
        m.qkv.weight.copy_(torch.cat([ref.q_proj.weight, ref.k_proj.weight, ref.v_proj.weight]))
        m.out.weight.copy_(ref.o_proj.weight)
        if bias:
            m.qkv.bias.copy_(torch.cat([ref.q_proj.bias, ref.k_proj.bias, ref.v_proj.bias]))
            m.out.bias.copy_(ref.o_proj.bias)
    x = torch.randn(B, T, 32, dtype=torch.float64)
    no_rotation = (torch.ones(B, T, head_dim, dtype=torch.float64), torch.zeros(B, T, head_dim, dtype=torch.float64))
    additive, _ = additive_mask(causal=True, padded=False)
    y_ref, w_ref = ref(x, position_embeddings=no_rotation, attention_mask=additive)
    y, w = m(x)
    # Llama's eager attention runs its softmax in float32 even for float64 inputs (about 1e-7 off in the
    # weights, under 1e-6 in y), so agreement is float32-close, not float64-close.
    assert_conforms(y, w, y_ref, w_ref, tol=1e-5)


def test_matches_bert_self_attention_bidirectional_with_padding():
    config = transformers.BertConfig(hidden_size=16, num_attention_heads=4, intermediate_size=32,
                                     attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
                                     attn_implementation="eager")
    ref = randomize(BertAttention(config))  # self-attention, then dense (W_O), residual and LayerNorm
    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64).eval()
    with torch.no_grad():
        self_attention = ref.self
        m.qkv.weight.copy_(torch.cat([self_attention.query.weight, self_attention.key.weight,
                                      self_attention.value.weight]))
        m.qkv.bias.copy_(torch.cat([self_attention.query.bias, self_attention.key.bias, self_attention.value.bias]))
        m.out.weight.copy_(ref.output.dense.weight)
        m.out.bias.copy_(ref.output.dense.bias)
    x = torch.randn(B, T, 16, dtype=torch.float64)
    additive, keep = additive_mask(causal=False, padded=True)
    y_ref, w_ref = ref(x, attention_mask=additive)
    y, w = m(x, mask=mha.padding_mask(LENGTHS, T)[:, None, None, :], causal=False)
    # BERT's residual and LayerNorm come after W_O, outside multi-head attention.
    y = ref.output.LayerNorm(y + x)
    assert_conforms(y, w, y_ref, w_ref, tol=1e-12)
    assert torch.equal(keep.expand(B, 4, T, T), w > 0)  # padding keys get exactly zero weight
