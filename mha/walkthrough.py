"""The article's walk-through as text: shapes at every step, parameter counts, the PyTorch check.

``python -m mha`` prints it; ``--d-model``, ``--heads``, ``--batch`` and
``--tokens`` change the configuration.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import scaled_dot_product_attention
from .heads import merge_heads, split_heads
from .interop import to_torch, to_torch_attn_mask
from .masks import causal_mask
from .multihead import MultiHeadAttention
from .parameters import count_parameters

# What walkthrough() keeps alive at its peak, in float64 numbers, measured (peak RSS over a warmed-up process)
# and rounded up: about 7.5 (B, h, T, T) weight tables (its own scores and weights, nn.MultiheadAttention's,
# the fused path's and the module's), about 28 (B, T, d_model) activations, and about 8.5 d_model^2 weight
# matrices (the layer in float32 and float64, its nn.MultiheadAttention copy, the one-head layer it counts).
# tests/test_cli.py measures the peak at the largest sizes `python -m mha` accepts, one per term.
_TABLES, _ACTIVATIONS, _WEIGHTS = 9, 36, 10


def memory_needed(d_model: int, h: int, B: int, T: int) -> int:
    """Bytes that ``walkthrough(d_model, h, B, T)`` needs at its peak: an upper bound, known before it allocates.

    All float64 (8 bytes a number): ``8 * (9 B h T^2 + 36 B T d_model + 10 d_model^2)``. The first term, the
    (B, h, T, T) attention weights that the walk-through computes four ways, dominates at any long sequence.
    """
    return 8 * (_TABLES * B * h * T * T + _ACTIVATIONS * B * T * d_model + _WEIGHTS * d_model * d_model)


def walkthrough(d_model: int = 32, h: int = 4, B: int = 2, T: int = 6, seed: int = 0) -> list[str]:
    """Run one causal self-attention step by step and describe it, one line per step.

    Runs in float64 on the CPU so the PyTorch comparison is exact to ~1e-15.

    Raises:
        ValueError: d_model is not divisible by h, or a size is not positive.
    """
    for name, n in (("batch", B), ("tokens", T)):
        if n <= 0:
            raise ValueError(f"{name} must be positive, got {n}")
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, h).double()
    x = torch.randn(B, T, d_model, dtype=torch.float64)
    lines = [f"Multi-head attention: B={B}, T={T}, d_model={d_model}, h={h}, d_k={m.d_k}", ""]

    def step(label, t):
        lines.append(f"  {label:<44} {tuple(t.shape)}")

    step("x", x)
    qkv = m.qkv(x)  # one matmul computes Q, K and V for every head
    step("qkv = x @ [W_Q; W_K; W_V]^T", qkv)
    q, k, v = qkv.split(d_model, dim=-1)
    step("Q, K, V (each)", q)
    q, k, v = (split_heads(t, h) for t in (q, k, v))
    step("heads: Q, K, V viewed as (B, h, T, d_k)", q)
    scores = q @ k.transpose(-2, -1) / m.d_k**0.5
    step("scores = Q K^T / sqrt(d_k)", scores)
    mask = causal_mask(T)
    step("causal mask (True = may attend)", mask)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    step("weights = softmax(scores, masked)", w)
    step("per-head outputs = weights @ V", out)
    concat = merge_heads(out)
    step("concatenated heads", concat)
    y = m.out(concat)
    step("y = concat @ W_O^T", y)

    wide, many = count_parameters(MultiHeadAttention(d_model, 1)), count_parameters(m)
    lines += [
        "",
        "Parameters (weights + biases = total):",
        f"  {'1 head:':<10}{wide.weights:,} + {wide.biases:,} = {wide.total:,}",
        f"  {f'{h} heads:':<10}{many.weights:,} + {many.biases:,} = {many.total:,}",
        f"  formula 4*d_model^2 + 4*d_model = {4 * d_model**2 + 4 * d_model:,}",
    ]

    ref = to_torch(m)
    y_ref, w_ref = ref(x, x, x, attn_mask=to_torch_attn_mask(mask), average_attn_weights=False)
    fused = F.scaled_dot_product_attention(*(split_heads(t, h) for t in m.qkv(x).split(d_model, -1)), is_causal=True)
    y_sdpa = m.out(merge_heads(fused))
    y_mod, _ = m(x)
    lines += [
        "",
        "Check against PyTorch (float64):",
        f"  {'module == step by step:':<40}{torch.equal(y_mod, y)}",
        f"  {'y vs nn.MultiheadAttention:':<40}max |diff| = {_diff(y, y_ref)}",
        f"  {'weights vs nn.MultiheadAttention:':<40}max |diff| = {_diff(w, w_ref)}",
        f"  {'y vs F.scaled_dot_product_attention:':<40}max |diff| = {_diff(y, y_sdpa)}",
    ]
    return lines


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    d = (a - b).abs().max().item()
    return "0" if d == 0 else f"{d:.0e}"
