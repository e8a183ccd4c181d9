"""A layer of some of a layer's heads: :func:`from_heads`, the piece tensor parallelism cuts a layer into.

Each rank of :func:`mha.parallel.shard_heads` holds ``from_heads(layer, its_heads, out_bias=False)``; notebook 08
counts one such piece's FLOPs. It moved here from ``mha.MultiHeadAttention.from_heads`` (mha 0.4): only this tool
uses it.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from ..efficient import GroupedQueryAttention
from ..interop import check_plain_linears
from ..multihead import MultiHeadAttention


def from_heads(layer: MultiHeadAttention, heads, *, out_bias: bool = True) -> GroupedQueryAttention:
    """A new layer holding the query heads ``heads`` of ``layer``, and the K/V heads they use.

    Its weights are copies: the rows of W_Q, W_K and W_V (and of qkv's bias) of those heads, and the columns of
    W_O that multiply their outputs. Its head i is ``layer``'s head ``heads[i]``, so its forward returns those
    heads' weights, in that order, and its output is their share of ``layer``'s output:

        layer(x)[0] == sum, over a partition P of the heads, of from_heads(layer, P, out_bias=False)(x)[0]
                       + layer.out.bias

    which is how tensor parallelism splits a layer (Shoeybi et al. 2019, §3). d_model, d_k, dropout, device,
    dtype, training mode and each parameter's ``requires_grad`` are kept; making it draws no random numbers.

    Args:
        layer: an ``mha.MultiHeadAttention`` (or ``mha.GroupedQueryAttention``).
        heads: a range or sequence of distinct query-head indices in [0, layer.h). With grouped-query attention
            (query head i uses K/V head i // (h / n_kv_heads)) they must make a layer of their own: the heads of
            each K/V head they use side by side, equally many for each, e.g. ``range(0, h // 2)``.
        out_bias: False gives ``out`` no bias, so that partial outputs can be summed and W_O's bias added once.

    Returns:
        An ``mha.GroupedQueryAttention`` with h = len(heads), n_kv_heads = the K/V heads used, the same d_k.

    Raises:
        TypeError: ``layer`` is not an ``mha.MultiHeadAttention``, ``heads`` is not a range or sequence, or a
            head index is not an int (a bool neither). ValueError: no heads, a head out of range or given twice,
            heads that make no layer (names them), or a wrapped ``qkv`` or ``out`` (a hook, an adapter, pruning),
            which copying their weights would leave out (case C23).
    """
    h_ids, kv_ids = _check_heads(layer, heads)
    weight, d_k = layer.qkv.weight, layer.d_k
    has_bias = layer.qkv.bias is not None
    # Built on the meta device and given memory without initialising it: no random numbers drawn.
    new = GroupedQueryAttention(layer.d_model, len(h_ids), n_kv_heads=len(kv_ids), d_k=d_k, bias=has_bias,
                                dropout=layer.dropout, device="meta", dtype=weight.dtype)
    out_has_bias = out_bias and layer.out.bias is not None
    if (new.out.bias is not None) != out_has_bias:  # W_O's bias: kept, or left to add once after a sum
        new.out = nn.Linear(len(h_ids) * d_k, layer.d_model, bias=out_has_bias, device="meta", dtype=weight.dtype)
    new.to_empty(device=weight.device)
    rows, cols = head_rows(layer, h_ids, kv_ids).to(weight.device), _columns(h_ids, d_k).to(weight.device)
    with torch.no_grad():
        new.qkv.weight.copy_(weight[rows])
        if has_bias:
            new.qkv.bias.copy_(layer.qkv.bias[rows])
        new.out.weight.copy_(layer.out.weight[:, cols])
        if new.out.bias is not None:
            new.out.bias.copy_(layer.out.bias)
    for mine, theirs in ((new.qkv.weight, weight), (new.qkv.bias, layer.qkv.bias),
                         (new.out.weight, layer.out.weight), (new.out.bias, layer.out.bias)):
        if mine is not None:
            mine.requires_grad_(theirs.requires_grad)  # frozen stays frozen
    return new.train(layer.training)


def kv_heads(layer: MultiHeadAttention) -> int:
    """The layer's number of K/V heads: ``n_kv_heads`` of a ``GroupedQueryAttention``, h of the lesson's layer."""
    return getattr(layer, "n_kv_heads", layer.h)


def head_rows(layer: MultiHeadAttention, h_ids, kv_ids) -> torch.Tensor:
    """Rows of ``layer.qkv.weight`` for the query heads ``h_ids`` and K/V heads ``kv_ids``, in the order
    [W_Q rows of h_ids; W_K rows of kv_ids; W_V rows of kv_ids]: a 1-D int64 tensor on the CPU."""
    d_k = layer.d_k
    k_start, v_start = layer.h * d_k, (layer.h + kv_heads(layer)) * d_k  # where W_K and W_V begin in qkv
    return torch.cat([_columns(h_ids, d_k), k_start + _columns(kv_ids, d_k), v_start + _columns(kv_ids, d_k)])


def _columns(ids, d_k) -> torch.Tensor:
    """Indices i*d_k ... (i+1)*d_k - 1 of each head i, in order: head i's slice of a (.., h*d_k) dim."""
    return (torch.tensor(list(ids), dtype=torch.long)[:, None] * d_k + torch.arange(d_k)).flatten()


def _check_heads(layer, heads) -> tuple[list[int], list[int]]:
    """``from_heads``' heads: (query heads, the K/V heads they use), checked to make a layer."""
    if not isinstance(layer, MultiHeadAttention):
        raise TypeError(f"from_heads needs an mha.MultiHeadAttention, got {type(layer).__name__}")
    if isinstance(heads, (str, bytes)) or not isinstance(heads, (range, list, tuple, torch.Tensor)):
        raise TypeError(f"heads must be a range or sequence of query-head indices, got {type(heads).__name__} "
                        f"{heads!r}")
    h_ids = [_head_index(i) for i in heads]
    if not h_ids:
        raise ValueError("from_heads needs at least one head")
    if len(set(h_ids)) < len(h_ids) or not all(0 <= i < layer.h for i in h_ids):
        raise ValueError(f"heads must be distinct indices in [0, h={layer.h}), got {h_ids}")
    per_kv = layer.h // kv_heads(layer)
    used = [i // per_kv for i in h_ids]  # the K/V head each chosen query head uses
    kv_ids = list(dict.fromkeys(used))
    # The new layer's query head j uses its K/V head j // (h' / g'): the chosen heads must come in runs, one per
    # K/V head, all of one length.
    if len(h_ids) % len(kv_ids) or used != [kv for kv in kv_ids for _ in range(len(h_ids) // len(kv_ids))]:
        raise ValueError(f"heads {h_ids} use K/V heads {used} (query head i uses K/V head i // {per_kv}); a layer "
                         "needs the query heads of each K/V head it uses side by side, equally many for each")
    check_plain_linears(layer, "mha.parallel.from_heads")
    return h_ids, kv_ids


def _head_index(i) -> int:
    """An int head index (a 0-dim integer tensor counts); not a float, nor a bool (True would be head 1)."""
    if not isinstance(i, bool) and not (isinstance(i, torch.Tensor) and i.dtype == torch.bool):
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise TypeError(f"head indices must be ints, got {i!r}")
