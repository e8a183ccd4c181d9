"""Ranks that disagree: found before any partial output is summed, and refused on every rank alike.

A shard's forward sums the partial outputs of N ranks. If the ranks hold different weights, or were
called with different inputs, that sum is a number, of the right shape, and meaningless; if one rank
raises while the others go on into the sum, they wait for it until the process group times out. So the
ranks compare notes first:

- :func:`agree_on_layer` (once, in ``shard_heads``): each rank's layer sizes, dtype, training mode and a
  SHA-256 of every parameter's bytes, or the error its own checks raised;
- :func:`agree_on_call` (every forward): each rank's error, if any, and a fixed-size fingerprint of its
  inputs: shape, dtype and three sums of their bits (an integer view of the values, so the sums are exact
  whatever the order of addition), one of them weighted by row and one by column, so that rows or columns
  in another order count as different.

Both are one collective that every rank enters, whatever happened to it before, so every rank learns the
same thing and raises the same way: the rank that failed raises its own error, the others a RuntimeError
naming it; ranks that disagree all raise a ValueError naming the ranks and what differs.
"""

from __future__ import annotations

import hashlib
import zlib

import torch
import torch.distributed as dist

_MAX_DIMS = 6  # dimensions of a shape kept in a fingerprint (x is 3-D, a mask at most 4-D)
# One fingerprint: present (0 None, 1 tensor, 2 something else, 3 unreadable), dtype code, ndim,
# _MAX_DIMS sizes, then the three sums.
_LENGTH = 3 + _MAX_DIMS + 3
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> same-size int


def fingerprint(t) -> list[int]:
    """Shape, dtype and three exact sums of the bits of ``t`` (a tensor, None or anything else)."""
    if t is None:
        return [0] * _LENGTH
    if not isinstance(t, torch.Tensor):
        return [2] + [0] * (_LENGTH - 1)
    shape = list(t.shape[:_MAX_DIMS]) + [-1] * (_MAX_DIMS - min(t.dim(), _MAX_DIMS))
    head = [1, zlib.crc32(str(t.dtype).encode()), t.dim(), *shape]
    try:
        t = t.detach()
        if t.is_floating_point() or t.is_complex():
            t = t.contiguous().view(_INTS[t.element_size()])  # the bits, exactly
        table = t.to(torch.int64).reshape(-1, t.shape[-1] if t.dim() else 1)  # (rows, last dim)
        rows, cols = table.sum(1), table.sum(0)
        odd = lambda n: 2 * torch.arange(n, device=table.device) + 1  # noqa: E731 -- position weights
        sums = torch.stack([rows.sum(), (rows * odd(len(rows))).sum(), (cols * odd(len(cols))).sum()])
        return head + sums.tolist()
    except Exception:  # a tensor this cannot read (a meta or sparse tensor): only its shape counts
        return [3] + head[1:] + [0, 0, 0]


def describe(fp: list[int]) -> str:
    """A fingerprint's shape and dtype, in words."""
    present, code, ndim, *rest = fp
    if present == 0:
        return "None"
    if present == 2:
        return "not a tensor"
    shape = tuple(rest[: min(ndim, _MAX_DIMS)]) + ((...,) if ndim > _MAX_DIMS else ())
    dtypes = {zlib.crc32(str(d).encode()): str(d) for d in _DTYPES}
    return f"shape {shape}, {dtypes.get(code, 'another dtype')}"


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8)


def agree_on_call(group, device, error: BaseException | None, fields: dict[str, list[int]]) -> None:
    """One all-gather of every rank's error flag and input fingerprints; raises on every rank alike.

    Args:
        group: the process group. device: where the collective's tensor lives (CPU for gloo, the rank's
            GPU for NCCL).
        error: the exception this rank's own work raised, or None.
        fields: name -> a list of ints (a :func:`fingerprint`, or flags), the same names and lengths on
            every rank.

    Raises:
        ``error`` itself on the rank that raised it; RuntimeError naming that rank on the others; ValueError
        naming the ranks and the fields that differ when the fingerprints do.
    """
    row = [0 if error is None else 1] + [n for values in fields.values() for n in values]
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    rows = [r.tolist() for r in rows]
    if any(r[0] for r in rows):  # every rank takes this branch together, so one more collective is safe
        texts: list = [None] * world
        dist.all_gather_object(texts, _text(error), group=group)
        _raise_failure(error, texts)
    differences = []
    start = 1
    for name, values in fields.items():
        stop = start + len(values)
        ranks = [r for r in range(1, world) if rows[r][start:stop] != rows[0][start:stop]]
        if ranks:
            differences.append(_difference(name, rows, ranks, start, stop))
        start = stop
    if differences:
        raise ValueError(
            "the ranks called the sharded layer with different inputs, so their partial outputs cannot be "
            f"summed: {'; '.join(differences)}. Every rank must pass the same x, context, mask and flags "
            "(and keep its cache in step)"
        )


_FLAGS = {0: "False", 1: "True", 2: "not a bool", 3: "None"}  # how the shard encodes causal and need_weights


def _difference(name, rows, ranks, start, stop):
    ours = rows[0][start:stop]
    if name in ("causal", "need_weights"):
        return f"{name}: rank 0: {_FLAGS[ours[0]]}, " + ", ".join(f"rank {r}: {_FLAGS[rows[r][start]]}" for r in ranks)
    if len(ours) == _LENGTH:  # a tensor's fingerprint
        seen = [f"rank {r}: {describe(rows[r][start:stop])}" for r in ranks]
        if all(describe(rows[r][start:stop]) == describe(ours) for r in ranks):
            return f"{name} has the same shape and dtype on every rank but other values on rank(s) {ranks}"
        return f"{name}: rank 0: {describe(ours)}, " + ", ".join(seen)
    return f"{name}: rank 0: {ours if len(ours) > 1 else ours[0]}, " + ", ".join(
        f"rank {r}: {rows[r][start:stop] if len(ours) > 1 else rows[r][start]}" for r in ranks)


def layer_summary(module) -> dict:
    """What must be the same on every rank for its shards to make one layer."""
    g = getattr(module, "n_kv_heads", module.h)  # the lesson's layer has h K/V heads
    return {
        "sizes": {"d_model": module.d_model, "h": module.h, "n_kv_heads": g, "d_k": module.d_k},
        "dtype": str(module.qkv.weight.dtype),
        "dropout": module.dropout,
        "training": module.training,
        "parameters": {name: _digest(p) for name, p in module.named_parameters()},
    }


def _digest(p: torch.Tensor) -> str:
    t = p.detach().to("cpu").contiguous().clone()  # a storage of exactly its own bytes
    return hashlib.sha256(str((tuple(t.shape), t.dtype)).encode() + bytes(t.untyped_storage())).hexdigest()


def agree_on_layer(group, error: BaseException | None, summary: dict | None) -> None:
    """One all-gather of every rank's error and :func:`layer_summary`; raises on every rank alike."""
    world = dist.get_world_size(group)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (_text(error), summary), group=group)
    if any(text is not None for text, _ in gathered):
        _raise_failure(error, [text for text, _ in gathered])
    ours = gathered[0][1]
    differences = []
    for key in ("sizes", "dtype", "dropout", "training"):
        ranks = [r for r in range(1, world) if gathered[r][1][key] != ours[key]]
        if ranks:
            differences.append(f"{key}: rank 0: {ours[key]}, " + ", ".join(
                f"rank {r}: {gathered[r][1][key]}" for r in ranks))
    if not differences:
        for name, digest in ours["parameters"].items():
            ranks = [r for r in range(1, world) if gathered[r][1]["parameters"].get(name) != digest]
            if ranks:
                differences.append(f"{name} differs between rank 0 and rank(s) {ranks}")
    if differences:
        raise ValueError(
            "shard_heads needs the same layer on every rank, but the ranks hold different ones: "
            f"{'; '.join(differences)}. Build it after torch.manual_seed(s) with the same s on every rank, "
            "or load one checkpoint on every rank"
        )


def _text(error):
    return None if error is None else f"{type(error).__name__}: {error}"


def _raise_failure(error, texts):
    """Raise on this rank, once every rank knows which ranks failed and why (``texts``, one per rank)."""
    failed = [r for r, text in enumerate(texts) if text is not None]
    if error is not None:
        if hasattr(error, "add_note"):
            error.add_note(f"(every rank of the group raised, so that none waits for a sum; failed: ranks {failed})")
        raise error
    first = failed[0]
    raise RuntimeError(
        f"rank {first} of {len(texts)} raised {texts[first]}; this rank stops too, so that no rank waits for a "
        f"sum that will not come (ranks that raised: {failed})"
    )
