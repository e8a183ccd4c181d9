"""Counting a layer's parameters: weights and biases apart (notebook 02's "What h costs")."""

from __future__ import annotations

from typing import NamedTuple

from torch import nn


class ParameterCount(NamedTuple):
    """Weights (matrices), biases (vectors) and their total."""

    weights: int
    biases: int
    total: int


def count_parameters(module: nn.Module) -> ParameterCount:
    """Count a module's trainable parameters, weights and biases apart.

    A parameter counts as a bias when its own name contains ``bias`` (``qkv.bias``, ``in_proj_bias``,
    ``out_proj.bias``, ``bias_k``); everything else is a weight. Works on ``mha.MultiHeadAttention``, on
    ``mha.GroupedQueryAttention`` and on ``torch.nn.MultiheadAttention``.

    For multi-head attention with d_model = D the count is 4·D² weights plus 4·D biases, whatever h is: the heads
    split the projections, they don't add to them. With grouped-query attention (g K/V heads of width d_k) it is
    2·D·h·d_k + 2·D·g·d_k weights (2·D² + 2·D·g·d_k when h·d_k = D).

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"count_parameters needs an nn.Module, got {type(module).__name__}")
    weights = biases = 0
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if "bias" in name.rsplit(".", 1)[-1]:  # bias, in_proj_bias, bias_k, ...
            biases += p.numel()
        else:
            weights += p.numel()
    return ParameterCount(weights, biases, weights + biases)
