"""Sharding a layer's heads across ranks: which rows and columns each rank holds, and the shard module.

See :mod:`mha.parallel` for the idea (Megatron-LM's tensor-parallel attention) and how seeds work.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..efficient import KVCache
from ..multihead import MultiHeadAttention
from .agree import agree_on_call, agree_on_layer, fingerprint, layer_summary
from .checkpoints import check_shard, save_shard
from .heads import from_heads, head_rows, kv_heads

__all__ = ["ShardedMultiHeadAttention", "out_columns", "qkv_rows", "shard_heads"]


def qkv_rows(module: MultiHeadAttention, rank: int, world_size: int) -> torch.Tensor:
    """Indices of the rows of ``module.qkv.weight`` (and bias) that ``rank`` holds.

    ``module.qkv.weight`` is (d_model + 2 * n_kv_heads * d_k, d_model) with
    rows [W_Q; W_K; W_V]. Rank r of N holds query heads r*h/N ... (r+1)*h/N - 1
    and K/V heads r*g/N ... (r+1)*g/N - 1 (g = n_kv_heads), so its rows are

        [W_Q rows of its query heads; W_K rows of its K/V heads; W_V rows of them]

    in that order: the layout of a ``MultiHeadAttention`` with h/N heads.
    With grouped-query attention, query head i uses K/V head i // (h/g), and
    the query heads of a rank use exactly the K/V heads of that rank.

    Returns:
        A 1-D int64 tensor of (h/N + 2*g/N) * d_k row indices, on the CPU.

    Raises:
        ValueError: N does not divide h or n_kv_heads, or rank is not in
            [0, N).
    """
    _check_split(module, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in [0, world_size={world_size})")
    return head_rows(module, _head_range(module.h, rank, world_size), _head_range(kv_heads(module), rank, world_size))


def out_columns(module: MultiHeadAttention, rank: int, world_size: int) -> torch.Tensor:
    """Indices of the columns of ``module.out.weight`` (W_O) that ``rank`` holds.

    W_O is stored as (d_model, h*d_k); column block i*d_k ... (i+1)*d_k - 1
    multiplies head i's output. Returns the h/N * d_k columns of the query
    heads of ``rank`` (see :func:`qkv_rows`), a 1-D int64 tensor on the CPU.

    Raises:
        ValueError: as :func:`qkv_rows`.
    """
    _check_split(module, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in [0, world_size={world_size})")
    q = _head_range(module.h, rank, world_size)
    return torch.arange(q.start * module.d_k, q.stop * module.d_k)


class ShardedMultiHeadAttention(nn.Module):
    """One rank's share of a ``MultiHeadAttention``'s heads; build it with :func:`shard_heads`.

    Attributes:
        heads: ``mha.parallel.from_heads(full, head_ids, out_bias=False)``, an
            ``mha.GroupedQueryAttention`` holding this rank's h/N query heads
            and n_kv_heads/N K/V heads (d_k unchanged): ``heads.qkv.weight`` is
            ``full.qkv.weight[qkv_rows(full, rank, N)]`` and
            ``heads.out.weight`` is ``full.out.weight[:, out_columns(...)]``.
            Its ``out`` has no bias: a partial output per rank.
        out_bias: W_O's bias, (d_model,), the same on every rank, added once
            after the sum (None when the module has no biases).
        rank, world_size, group: this rank, N, and the process group.
        d_model, h, n_kv_heads, d_k: the full layer's sizes.
        head_ids, kv_head_ids: ``range`` of the global query and K/V heads
            held here.

    **Checkpoints are per rank.** ``shard.state_dict()`` holds this rank's
    weights only: each rank saves its own file and loads it back on the same
    rank of the same split. What the shard holds (its rank, N, its heads and
    the full layer's sizes) travels in the state_dict's metadata (no tensor,
    no key, so ``to_empty`` and ``torch.func.functional_call`` are
    unaffected), and ``load_state_dict`` refuses another rank's shard, or a
    shard of another split or layer, naming both (case C30): every rank's
    weights have the same shapes, so they would load and compute other heads.
    A dict that lost the metadata (rebuilt by a comprehension, or read from
    safetensors) loads unchecked. For one file of the whole layer, every rank
    calls :func:`full_state_dict`; to shard a saved whole layer again, load it
    into the whole layer and shard that::

        state = mha.parallel.full_state_dict(shard)  # on every rank: a collective
        if dist.get_rank() == 0:
            torch.save(state, "layer.pt")
        layer = mha.MultiHeadAttention(d_model, h)  # later, on any number of ranks
        layer.load_state_dict(torch.load("layer.pt"))
        shard = mha.parallel.shard_heads(layer)
    """

    def __init__(
        self, module: MultiHeadAttention, group: dist.ProcessGroup | None = None, *, check_ranks: bool = True
    ) -> None:
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            _check_module(module)  # the plainer mistake first
            _check_initialized()
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.check_ranks = check_ranks
        error = None
        try:
            _check_split(module, self.world_size)
        except Exception as err:  # told to every rank below, so that no rank waits for this one
            error = err
        agree_on_layer(self.group, error, None if error else layer_summary(module))
        self.d_model, self.h, self.n_kv_heads, self.d_k = module.d_model, module.h, kv_heads(module), module.d_k
        self.head_ids = _head_range(self.h, self.rank, self.world_size)
        self.kv_head_ids = _head_range(self.n_kv_heads, self.rank, self.world_size)
        self.heads = from_heads(module, self.head_ids, out_bias=False)
        bias = module.out.bias
        self.out_bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
        self._meshes: dict[str, Any] = {}  # DeviceMesh per device type ("cpu", "cuda"), made on first use
        self.register_state_dict_post_hook(save_shard)  # what it holds, in the metadata (case C30)
        self.register_load_state_dict_pre_hook(check_shard)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        causal: bool | None = None,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The full layer's output, computed from this rank's heads and one all-reduce.

        Call it on every rank of the group, with the same x, context, mask and
        flags (a collective: a rank that does not call it makes the others
        wait, up to the process group's timeout). With ``check_ranks`` (the
        default) the ranks compare their inputs first (one all-gather of a
        fingerprint per rank, see :mod:`mha.parallel.agree`); in training mode
        with dropout each rank's heads draw their own masks (see "Seeds" in
        :mod:`mha.parallel`).

        Args:
            x, context, causal, need_weights: as ``MultiHeadAttention.forward``.
            mask: keep-mask that broadcasts to (B, h, T, S) of the *full*
                layer; a per-head mask (h in dim -3) is cut to this rank's
                heads here.
            cache: this rank's own ``KVCache``: it stores (B, n_kv_heads/N,
                S, d_k), this rank's K/V heads only.

        Returns:
            ``(y, w)``: y (B, T, d_model), the full layer's output, the same on
            every rank; w (B, h/N, T, S), the weights of this rank's heads
            (global heads ``head_ids``), or None.

        Raises:
            As ``MultiHeadAttention.forward`` (and ValueError for a mask whose
            head dimension is neither 1 nor h) on the rank whose input is bad,
            and RuntimeError naming that rank on the others; ValueError on
            every rank when the ranks' inputs differ (names the ranks and
            what differs). Nothing is summed then, so no rank is left waiting.
            Without ``check_ranks`` a rank's error is raised on that rank only.
        """
        fields = self._fingerprints(x, context, mask, causal, need_weights, cache) if self.check_ranks else {}
        saved = cache._snapshot() if isinstance(cache, KVCache) else None  # a refused call leaves it as it was
        seed = self._dropout_seed()  # before anything can fail, so that every rank draws it
        error = None
        try:  # everything that may raise on one rank only, before any rank sums anything
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
            local_mask = self._local_mask(mask)
            mesh = self._mesh(x.device.type)
            x = _copy_to_ranks(x, mesh)  # f: identity; backward sums dL/dx over the ranks
            if isinstance(context, torch.Tensor):
                context = _copy_to_ranks(context, mesh)
            with self._dropout_stream(seed, x.device):
                y, w = self.heads(x, context, causal=causal, mask=local_mask, need_weights=need_weights, cache=cache)
        except Exception as err:
            error = err
        try:
            if self.check_ranks:
                agree_on_call(self.group, self._exchange_device(), error, fields)
            elif error is not None:
                raise error
        except BaseException:  # refused here or on another rank: no rank's cache keeps this step
            if saved is not None:
                cache._restore(saved)
            raise
        y = _sum_over_ranks(y, mesh)  # g: all-reduce; backward passes dL/dy through
        if self.out_bias is not None:
            y = y + self.out_bias  # once, after the sum (every rank adding it would count it N times)
        return y, w

    def _fingerprints(self, x, context, mask, causal, need_weights, cache) -> dict[str, list[int]]:
        flag = lambda b: 1 if b is True else 0 if b is False else 3 if b is None else 2  # noqa: E731 -- 2: the layer says
        return {
            "x": fingerprint(x), "context": fingerprint(context), "mask": fingerprint(mask),
            "causal": [flag(causal)], "need_weights": [flag(need_weights)],
            "the cache's length": [-1 if cache is None else len(cache) if isinstance(cache, KVCache) else -2],
        }

    def _exchange_device(self) -> torch.device:
        if dist.get_backend(self.group) == "nccl":  # NCCL moves only GPU tensors
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _dropout_seed(self) -> int | None:
        """In training mode with dropout: one draw b from the default CPU generator (the same draw on every
        rank, so their generators stay in step) and this rank's dropout seed, b + rank. Else None."""
        if not (self.heads.training and self.heads.dropout > 0):
            return None
        return int(torch.randint(2**62, ())) + self.rank

    @contextlib.contextmanager
    def _dropout_stream(self, seed: int | None, device: torch.device):
        """Run the heads on a generator of this rank's own, seeded with ``seed``, so that each rank's heads
        draw their own dropout masks (case C17); the default generators are restored afterwards.
        See "Seeds" in :mod:`mha.parallel`."""
        if seed is None:
            yield
            return
        forked = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=forked):
            torch.default_generator.manual_seed(seed)
            for d in forked:
                with torch.cuda.device(d):
                    torch.cuda.manual_seed(seed)
            yield

    def _mesh(self, device_type):
        if device_type not in self._meshes:
            from torch.distributed.device_mesh import DeviceMesh

            self._meshes[device_type] = DeviceMesh.from_group(self.group, device_type)
        return self._meshes[device_type]

    def _local_mask(self, mask):
        if not isinstance(mask, torch.Tensor) or mask.dim() < 3:
            return mask  # no head dimension (or not a tensor: the layer's own checks name it)
        n = mask.size(-3)
        if n == 1 or self.world_size == 1:
            return mask
        if n != self.h:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} has {n} heads in dim -3 but the layer has h={self.h} "
                f"(a mask must broadcast to the full layer's (B, h, T, S))"
            )
        return mask[..., self.head_ids.start : self.head_ids.stop, :, :]

    def extra_repr(self) -> str:
        kv = f", kv_heads={_show(self.kv_head_ids)} of {self.n_kv_heads}" if self.n_kv_heads != self.h else ""
        return f"rank={self.rank} of {self.world_size}, heads={_show(self.head_ids)} of {self.h}{kv}"


def shard_heads(
    module: MultiHeadAttention, group: dist.ProcessGroup | None = None, *, check_ranks: bool = True
) -> ShardedMultiHeadAttention:
    """This rank's shard of ``module``: h/N of its heads, run in parallel with the other ranks.

    Call it on every rank of ``group`` (default: the world group) after
    ``torch.distributed.init_process_group``, with the same module on every
    rank (same weights: build it from one seed or load one checkpoint; the
    ranks compare their layers' sizes and a hash of every parameter, and
    refuse to shard different ones). The shard copies its weights, so
    ``module`` can be deleted afterwards.

    Rank r of N keeps the rows of W_Q, W_K and W_V of its heads
    (:func:`qkv_rows`) and the matching columns of W_O (:func:`out_columns`):
    each rank holds 1/N of the layer's weights (W_O's bias is replicated).
    Its forward has the full module's signature and returns the full
    (B, T, d_model) y, after one sum all-reduce of B*T*d_model values, plus
    the weights of its own heads, (B, h/N, T, S). Forward and backward equal
    the unsharded module's: if every rank computes the same loss from y,
    the shard's parameter gradients are the matching slices of the full
    module's gradients, and x's gradient is the full one on every rank (one
    more all-reduce in the backward pass). With dropout in training mode
    every head draws its own mask, on every rank, and the weights stay the
    same on every rank (see "Seeds" in :mod:`mha.parallel`).

    ``check_ranks=False`` skips the comparison of every forward's inputs
    across ranks (one small all-gather per call); the layer is compared once
    either way.

    Works on any backend: gloo on CPU, NCCL with one process per GPU (move
    the module to the rank's GPU before sharding).

    Source: Shoeybi et al. 2019, "Megatron-LM", §3 (Figure 3b); the
    communication uses ``torch.distributed.tensor`` (DTensor) placements.

    Raises:
        TypeError: module is not an ``mha.MultiHeadAttention``.
        RuntimeError: the process group is not initialised; or another rank
            raised one of these (names it: every rank raises, none waits).
        ValueError: N does not divide h, or does not divide n_kv_heads
            (names the numbers); the ranks hold different layers (names
            the ranks and the sizes or parameters that differ).
    """
    return ShardedMultiHeadAttention(module, group, check_ranks=check_ranks)


# -- internals ---------------------------------------------------------------------------------------------


def _head_range(n: int, rank: int, world_size: int) -> range:
    per_rank = n // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def _show(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}..{r.stop - 1}"


def _check_module(module):
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"shard_heads needs an mha.MultiHeadAttention, got {type(module).__name__}")


def _check_initialized():
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "shard_heads needs an initialised process group: call torch.distributed.init_process_group(...) "
            "on every rank first (mha.parallel.run_on_ranks does this for you)"
        )


def _check_split(module, world_size):
    _check_module(module)
    h, g = module.h, kv_heads(module)
    if h % world_size:
        divisors = [n for n in range(1, h + 1) if h % n == 0]
        raise ValueError(
            f"cannot split h={h} heads across N={world_size} ranks: N must divide h (N in {divisors})"
        )
    if g % world_size:
        divisors = [n for n in range(1, g + 1) if g % n == 0]
        raise ValueError(
            f"cannot split n_kv_heads={g} K/V heads across N={world_size} ranks: with grouped-query "
            f"attention N must divide n_kv_heads too (N in {divisors})"
        )


def _copy_to_ranks(t, mesh):
    """Megatron's f: identity forward; backward all-reduces the partial input gradients."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    return DTensor.from_local(t, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def _sum_over_ranks(t, mesh):
    """Megatron's g: all-reduce (sum) forward; backward passes the (replicated) gradient through."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    return DTensor.from_local(t, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()]).to_local()


