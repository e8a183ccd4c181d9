"""An attention layer's parameters outside its forward: counting them, saving them, copying some heads' of them.

* :func:`count_parameters` counts any module's, weights and biases apart;
* :class:`LayerParameters`, a base class of ``mha.MultiHeadAttention``, gives the layer what it does with its
  parameters besides attending: its head counts in every ``state_dict`` (``get_extra_state``), checked when a
  checkpoint loads (cases C19, C22), and ``from_heads``, a layer of some of its heads (``mha.parallel`` shards a
  layer so);
* :func:`check_plain_linears` refuses a wrapped ``qkv`` or ``out`` to the paths that copy their weights instead
  of calling them (``from_heads``, ``mha.to_torch``; case C23).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch import nn

from .values import sequence


class ParameterCount(NamedTuple):
    """Weights (matrices), biases (vectors) and their total."""

    weights: int
    biases: int
    total: int


def count_parameters(module: nn.Module) -> ParameterCount:
    """Count a module's trainable parameters, weights and biases apart.

    A parameter counts as a bias when its own name contains ``bias``
    (``qkv.bias``, ``in_proj_bias``, ``out_proj.bias``, ``bias_k``);
    everything else is a weight. Works on
    ``mha.MultiHeadAttention`` and on ``torch.nn.MultiheadAttention``.

    For multi-head attention with d_model = D the count is 4·D² weights plus
    4·D biases, whatever h is: the heads split the projections, they don't add
    to them. With grouped-query attention (g K/V heads of width d_k) it is
    2·D² + 2·D·g·d_k weights.

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


class LayerParameters:
    """What ``mha.MultiHeadAttention`` does with its parameters outside ``forward`` (see that class).

    The head counts reach the ``state_dict`` beside the weights, as its
    ``_extra_state``: the int64 tensor [h, n_kv_heads, d_k], made afresh at
    each save, which the layer does not hold, so building on the meta device,
    ``to_empty()``, ``torch.nn.utils.skip_init`` and
    ``load_state_dict(assign=True)`` have nothing to spoil (case C22).
    ``load_state_dict`` refuses a state_dict of other head counts (strict or
    not), before copying any weight (case C19). One without them (mha 0.2, or
    a dict built by other code) loads as before, and so does mha 0.3's, which
    saved them as a buffer, ``head_config``. To load this layer's state_dict
    into a module without that entry, leave it out (or pass ``strict=False``).
    """

    @classmethod
    def from_heads(cls, layer, heads, *, out_bias: bool = True):
        """A new layer holding the query heads ``heads`` of ``layer``, and the K/V heads they use.

        Its weights are copies: the rows of W_Q, W_K and W_V (and of qkv's
        bias) of those heads, and the columns of W_O that multiply their
        outputs. Its head i is ``layer``'s head ``heads[i]``, so its
        ``forward`` returns those heads' weights, in that order, and its output
        is their share of ``layer``'s output:

            layer(x)[0] == sum over a partition of the heads P of
                           from_heads(layer, P, out_bias=False)(x)[0] + layer.out.bias

        which is how tensor parallelism splits a layer (``mha.parallel``).
        d_model, d_k, dropout, device, dtype, training mode and each
        parameter's ``requires_grad`` are kept. Making it draws no random
        numbers.

        Args:
            layer: a ``MultiHeadAttention``.
            heads: a range or sequence of distinct query-head indices in
                [0, layer.h). With grouped-query attention (query head i uses
                K/V head i // (h / n_kv_heads)) the chosen heads must make a
                layer of their own: the heads of each K/V head they use side
                by side, equally many for each, e.g. ``range(0, h // 2)``.
            out_bias: False gives ``out`` no bias, so that partial outputs
                can be summed and W_O's bias added once after the sum.

        Returns:
            A ``MultiHeadAttention`` with h = len(heads), n_kv_heads = the
            number of K/V heads used, and the same d_k.

        Raises:
            TypeError: ``layer`` is not a ``MultiHeadAttention``, ``heads``
                is not a range or sequence (a single int, say), or a head
                index is not an int (bools are refused too).
            ValueError: no heads, a head out of range or given twice, heads
                that do not make a whole set of K/V heads (names them), or a
                ``qkv`` or ``out`` that something wraps (a hook, an adapter,
                pruning, quantization), which copying their weights would
                leave out.
        """
        h_ids, kv_ids = _check_heads(layer, heads)
        weight, d_k = layer.qkv.weight, layer.d_k
        has_bias = layer.qkv.bias is not None
        # Built on the meta device and then given uninitialised memory: no random initialisation,
        # so making a layer from heads does not move the random number generator.
        new = cls(
            layer.d_model, len(h_ids), n_kv_heads=len(kv_ids), d_k=d_k, bias=has_bias,
            dropout=layer.dropout, device="meta", dtype=weight.dtype,
        )
        out_has_bias = out_bias and layer.out.bias is not None
        if (new.out.bias is not None) != out_has_bias:  # W_O's bias: kept, or left to add once after a sum
            new.out = nn.Linear(len(h_ids) * d_k, layer.d_model, bias=out_has_bias, device="meta", dtype=weight.dtype)
        new.to_empty(device=weight.device)
        rows, cols = _qkv_rows(layer, h_ids, kv_ids), _columns(h_ids, d_k)
        with torch.no_grad():
            new.qkv.weight.copy_(weight[rows.to(weight.device)])
            if has_bias:
                new.qkv.bias.copy_(layer.qkv.bias[rows.to(weight.device)])
            new.out.weight.copy_(layer.out.weight[:, cols.to(weight.device)])
            if new.out.bias is not None:
                new.out.bias.copy_(layer.out.bias)
        for mine, theirs in ((new.qkv.weight, weight), (new.qkv.bias, layer.qkv.bias),
                             (new.out.weight, layer.out.weight), (new.out.bias, layer.out.bias)):
            if mine is not None:
                mine.requires_grad_(theirs.requires_grad)  # frozen stays frozen
        return new.train(layer.training)

    def get_extra_state(self) -> torch.Tensor:
        """The head counts [h, n_kv_heads, d_k] (int64), which every ``state_dict`` saves as ``_extra_state``.

        The weights have the same shapes for any h (and any n_kv_heads with d_k
        fixed), so without them a checkpoint of other head counts would load
        and compute something else (case C19). Made from the layer's ints at
        each save, they are no tensor the layer holds (case C22); a tensor, so
        safetensors keeps them.
        """
        return torch.tensor([self.h, self.n_kv_heads, self.d_k])

    def set_extra_state(self, state) -> None:
        """Refuse saved head counts that differ from this layer's (``load_state_dict`` calls it, before any weight
        is copied). They may come back in another dtype (``{k: v.half() for k, v in sd.items()}``)."""
        _check_checkpoint(self, state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args):
        # mha 0.3 saved the head counts as a buffer, head_config. load_state_dict hands each module its own copy.
        legacy = state_dict.pop(prefix + "head_config", None)
        if legacy is not None:
            state_dict.setdefault(prefix + "_extra_state", legacy)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)
        if prefix + "_extra_state" in missing_keys:  # none saved (mha 0.2, other code's modules): loads as before
            missing_keys.remove(prefix + "_extra_state")


def _check_heads(layer, heads) -> tuple[list[int], list[int]]:
    """``from_heads``' heads: (query heads, the K/V heads they use), checked to make a layer."""
    if not isinstance(layer, LayerParameters):  # the base class of mha.MultiHeadAttention, and of nothing else
        raise TypeError(f"from_heads needs an mha.MultiHeadAttention, got {type(layer).__name__}")
    h_ids = [_head_index(i) for i in sequence("heads", heads, "a range or sequence of query-head indices")]
    if not h_ids:
        raise ValueError("from_heads needs at least one head")
    if len(set(h_ids)) < len(h_ids) or not all(0 <= i < layer.h for i in h_ids):
        raise ValueError(f"heads must be distinct indices in [0, h={layer.h}), got {h_ids}")
    per_kv = layer.h // layer.n_kv_heads
    used = [i // per_kv for i in h_ids]  # the K/V head each chosen query head uses
    kv_ids = list(dict.fromkeys(used))
    # The new layer's query head j uses its K/V head j // (h' / g'): the chosen heads must come
    # in runs, one per K/V head, all of one length.
    if len(h_ids) % len(kv_ids) or used != [kv for kv in kv_ids for _ in range(len(h_ids) // len(kv_ids))]:
        raise ValueError(
            f"heads {h_ids} use K/V heads {used} (query head i uses K/V head i // {per_kv}); a layer needs "
            "the query heads of each K/V head it uses side by side, equally many for each"
        )
    check_plain_linears(layer, "MultiHeadAttention.from_heads")
    return h_ids, kv_ids


def _head_index(i) -> int:
    """An int head index (a 0-dim integer tensor counts); not a float, nor a bool (True would be head 1)."""
    if not isinstance(i, bool):
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise TypeError(f"head indices must be ints, got {i!r}")


def check_plain_linears(layer, path: str) -> None:
    """Raise unless ``layer.qkv`` and ``layer.out`` are plain ``nn.Linear`` modules with no hooks.

    ``path`` copies their weights rather than calling them, so it cannot apply what wraps them (case C23): an
    adapter module (LoRA), a subclass with its own forward, dynamic quantization, a forward hook or pruning
    (a hook too). A parametrization acts on the weight itself, so its weight is copied as it computes it.
    """
    for name in ("qkv", "out"):
        module = getattr(layer, name)
        if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
            if not (module._forward_hooks or module._forward_pre_hooks):
                continue
            what = "has forward hooks (torch.nn.utils.prune adds one)"
        else:
            what = f"is a {type(module).__module__}.{type(module).__qualname__}, not an nn.Linear"
        raise ValueError(
            f"{path} copies the weights of {name} instead of calling it, so it cannot apply what wraps it: "
            f"{name} {what}. Remove the wrapper first (merge an adapter into the weights, "
            "torch.nn.utils.prune.remove() a pruning), or call the layer itself"
        )


# -- from_heads' arithmetic ---------------------------------------------------------------------------------------


def _qkv_rows(layer, h_ids, kv_ids):
    """Rows of layer.qkv for the chosen heads: [W_Q rows of h_ids; W_K rows of kv_ids; W_V rows of kv_ids]."""
    d_k, k_start, v_start = layer.d_k, layer._widths[0], layer._widths[0] + layer._widths[1]
    return torch.cat([
        _columns(h_ids, d_k),
        k_start + _columns(kv_ids, d_k),
        v_start + _columns(kv_ids, d_k),
    ])


def _columns(ids, d_k):
    """Indices i*d_k ... (i+1)*d_k - 1 of each head i, in order: head i's slice of a (.., h*d_k) dim."""
    return (torch.tensor(ids, dtype=torch.long)[:, None] * d_k + torch.arange(d_k)).flatten()


def _check_checkpoint(layer, saved) -> None:
    """Raise unless saved head counts (``_extra_state``, or mha 0.3's ``head_config``) are the layer's."""
    names, mine = ("h", "n_kv_heads", "d_k"), [layer.h, layer.n_kv_heads, layer.d_k]
    if not isinstance(saved, torch.Tensor) or saved.shape != (3,):
        shown = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
        raise ValueError(f"the state_dict's head counts (_extra_state; head_config in mha 0.3) must be a tensor "
                         f"[h, n_kv_heads, d_k], got {shown}")
    if saved.is_meta:  # no values to compare (and no weights to copy)
        return
    saved = saved.detach().cpu()
    if not torch.equal(torch.tensor(mine).to(saved.dtype), saved):
        theirs = ", ".join(f"{name}={n:g}" for name, n in zip(names, saved.tolist()))
        raise ValueError(
            f"this state_dict is from a layer with {theirs}, but this layer has "
            f"{', '.join(f'{name}={n}' for name, n in zip(names, mine))}: the weights would load (their shapes can "
            "match) and compute something else; make the layer with the checkpoint's sizes"
        )
