"""A shard's checkpoints (case C30): what it holds travels in its state_dict's metadata, another rank's is refused,
and :func:`full_state_dict` gathers the whole layer's state_dict from every rank's shard.

``shard.state_dict()`` is per rank. The metadata (no tensor, no key) is written by a state-dict post-hook and
checked by a load pre-hook, as ``mha.MultiHeadAttention`` saves its h, so ``load_state_dict``, ``to_empty`` and
``torch.func.functional_call`` see only the weights.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ..efficient import GroupedQueryAttention
from ..multihead import MultiHeadAttention

__all__ = ["full_state_dict"]


def full_state_dict(shard) -> dict[str, torch.Tensor]:
    """The whole layer's state_dict, gathered from every rank's shard: call it on every rank (a collective).

    Every rank gets the same dict, loadable into the unsharded layer: ``mha.MultiHeadAttention(d_model, h)``
    (or ``mha.GroupedQueryAttention(d_model, h, n_kv_heads, d_k=d_k)`` for a layer with fewer K/V heads or
    another d_k), whose ``load_state_dict`` checks its h (case C19). Its rows are [W_Q; W_K; W_V] of every head
    in order and W_O's columns likewise, the layout :func:`shard_heads` cut; the tensors are detached copies on
    the shard's device. One all-gather per weight (``torch.distributed.all_gather``).

    Raises:
        TypeError: ``shard`` is not a :class:`ShardedMultiHeadAttention`.
    """
    # What a ShardedMultiHeadAttention holds, looked for by name: sharding.py imports this module (its hooks).
    if not (isinstance(getattr(shard, "heads", None), GroupedQueryAttention) and hasattr(shard, "head_ids")):
        raise TypeError(f"full_state_dict needs a ShardedMultiHeadAttention (shard_heads' result), got "
                        f"{type(shard).__name__}")
    heads, group, d_k = shard.heads, shard.group, shard.d_k

    def gathered(t):
        t = t.detach().contiguous()
        parts = [torch.empty_like(t) for _ in range(shard.world_size)]
        dist.all_gather(parts, t, group=group)
        return parts

    h_r, g_r = heads.h * d_k, heads.n_kv_heads * d_k  # rows of W_Q, and of W_K and of W_V, per rank
    plain = shard.n_kv_heads == shard.h and shard.h * d_k == shard.d_model
    kind = MultiHeadAttention if plain else functools.partial(GroupedQueryAttention, n_kv_heads=shard.n_kv_heads,
                                                              d_k=d_k)
    weight = heads.qkv.weight
    layer = kind(shard.d_model, shard.h, bias=heads.qkv.bias is not None, dropout=heads.dropout, device="meta",
                 dtype=weight.dtype).to_empty(device=weight.device)
    in_order = lambda parts: torch.cat([p.split([h_r, g_r, g_r])[i] for i in range(3) for p in parts])  # noqa: E731
    with torch.no_grad():
        layer.qkv.weight.copy_(in_order(gathered(weight)))
        if heads.qkv.bias is not None:
            layer.qkv.bias.copy_(in_order(gathered(heads.qkv.bias)))
        layer.out.weight.copy_(torch.cat(gathered(heads.out.weight), dim=1))
        if shard.out_bias is not None:
            layer.out.bias.copy_(shard.out_bias)
    return layer.state_dict()


def _holds(shard) -> dict:
    return {"rank": shard.rank, "world_size": shard.world_size, "heads": [shard.head_ids.start, shard.head_ids.stop],
            "kv_heads": [shard.kv_head_ids.start, shard.kv_head_ids.stop],
            "layer": {"d_model": shard.d_model, "h": shard.h, "n_kv_heads": shard.n_kv_heads, "d_k": shard.d_k}}


def save_shard(module, state_dict, prefix, local_metadata) -> None:
    local_metadata["mha.shard"] = _holds(module)  # ints and lists: torch.load(weights_only=True) reads them


def check_shard(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs) -> None:
    if prefix + "qkv.weight" in state_dict and prefix + "heads.qkv.weight" not in state_dict:
        raise ValueError("this is the state_dict of a whole layer, not of a shard: load it into the whole layer "
                         "(mha.MultiHeadAttention(d_model, h).load_state_dict(...)) and shard that with "
                         "shard_heads(layer)")
    saved, mine = local_metadata.get("mha.shard"), _holds(module)
    if saved is not None and saved != mine:
        raise ValueError(f"this state_dict was saved by {_describe(saved)}, but this shard is {_describe(mine)}: every "
                         "rank's weights have the same shapes, so they would load and compute other heads. "
                         f"shard.state_dict() is per rank: load the file rank {mine['rank']} saved, or save the "
                         "whole layer with mha.parallel.full_state_dict(shard) and shard it again")


def _describe(holds: dict) -> str:
    (q0, q1), (k0, k1), layer = holds["heads"], holds["kv_heads"], holds["layer"]
    sizes = ", ".join(f"{name}={n}" for name, n in layer.items())
    kv = f", K/V heads {_show(range(k0, k1))}" if layer["n_kv_heads"] != layer["h"] else ""
    return (f"rank {holds['rank']} of {holds['world_size']} (query heads {_show(range(q0, q1))}{kv}, of a layer "
            f"with {sizes})")


def _show(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}..{r.stop - 1}"
