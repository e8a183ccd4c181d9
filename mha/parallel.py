"""Heads across devices: tensor-parallel multi-head attention on ``torch.distributed``.

The heads of a layer are independent until W_O mixes them, and W_O's product
splits into one term per head:

    y = Concat(head_1, ..., head_h) W_O = sum_i head_i W_O_i

where W_O_i is head i's d_k-wide slice of W_O's input side. So N processes
("ranks") can each hold h/N heads -- those heads' rows of W_Q, W_K and W_V and
the matching columns of W_O (``nn.Linear`` stores W_O as (out, in)) -- compute
their own partial y, and one all-reduce (a sum over the ranks) gives every
rank the full y. This is Megatron-LM's tensor-parallel attention (Shoeybi et
al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism", §3 and Figure 3b).

Megatron names the two communication points f and g. g sums the partial
outputs in the forward pass and passes the gradient through unchanged; f
passes the input through unchanged and sums the input's partial gradients in
the backward pass (each rank's heads contribute a part of dL/dx). Both are
built here from PyTorch's ``DTensor`` placements (a ``Partial`` tensor
redistributed to ``Replicate`` is a sum all-reduce), so every rank computes
the same loss and gets exactly the unsharded module's gradients.

**The fused-qkv trap.** ``MultiHeadAttention.qkv`` stacks all of W_Q, then all
of W_K, then all of W_V. Cutting those rows into N contiguous blocks -- what
``torch.distributed.tensor.parallel.ColwiseParallel`` does to any Linear --
gives rank 0 all of W_Q and half of W_K when N = 2, and rank 1 the other half
of W_K and all of W_V: no rank has matching Q, K and V for any head.
:func:`qkv_rows` instead picks, for each rank, the Q rows, the K rows and the
V rows of *its* heads, so the shard is laid out [W_Q_r; W_K_r; W_V_r] exactly
like a smaller ``MultiHeadAttention``, and runs that class's own forward.

:func:`run_on_ranks` starts N local processes joined by one process group
(gloo on CPU), which is how the tests and notebook 07 run this module.

Needs torch >= 2.4 (``torch.distributed.tensor``).
"""

from __future__ import annotations

import datetime
import pickle
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from torch import nn

from .cache import KVCache
from .masks import check_int
from .multihead import MultiHeadAttention

__all__ = ["ShardedMultiHeadAttention", "out_columns", "qkv_rows", "run_on_ranks", "shard_heads"]


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
    d_k, h, g = module.d_k, module.h, module.n_kv_heads
    q, kv = _head_range(h, rank, world_size), _head_range(g, rank, world_size)
    k_start, v_start = h * d_k, (h + g) * d_k  # where W_K and W_V begin in qkv
    return torch.cat([
        torch.arange(q.start * d_k, q.stop * d_k),
        torch.arange(k_start + kv.start * d_k, k_start + kv.stop * d_k),
        torch.arange(v_start + kv.start * d_k, v_start + kv.stop * d_k),
    ])


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
        heads: a ``MultiHeadAttention`` holding this rank's h/N query heads and
            n_kv_heads/N K/V heads (d_k unchanged): ``heads.qkv.weight`` is
            ``full.qkv.weight[qkv_rows(full, rank, N)]`` and
            ``heads.out.weight`` is ``full.out.weight[:, out_columns(...)]``.
            Its ``out`` has no bias: a partial output per rank.
        out_bias: W_O's bias, (d_model,), the same on every rank, added once
            after the sum (None when the module has no biases).
        rank, world_size, group: this rank, N, and the process group.
        d_model, h, n_kv_heads, d_k: the full layer's sizes.
        head_ids, kv_head_ids: ``range`` of the global query and K/V heads
            held here.
    """

    def __init__(self, module: MultiHeadAttention, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        _check_module(module)
        _check_initialized()
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(self.group), dist.get_world_size(self.group)
        _check_split(module, self.world_size)
        self.d_model, self.h, self.n_kv_heads, self.d_k = module.d_model, module.h, module.n_kv_heads, module.d_k
        self.head_ids = _head_range(self.h, self.rank, self.world_size)
        self.kv_head_ids = _head_range(self.n_kv_heads, self.rank, self.world_size)
        self.heads = _some_heads(module, self.rank, self.world_size)
        bias = module.out.bias
        self.out_bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
        self._meshes: dict[str, Any] = {}  # DeviceMesh per device type ("cpu", "cuda"), made on first use

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        causal: bool = True,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The full layer's output, computed from this rank's heads and one all-reduce.

        Call it on every rank of the group, with the same x, context and mask
        (a collective: a rank that does not call it makes the others wait).

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
            As ``MultiHeadAttention.forward``, on every rank alike (inputs are
            checked before any communication); ValueError for a mask whose
            head dimension is neither 1 nor h.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        mask = self._local_mask(mask)
        mesh = self._mesh(x.device.type)
        x = _copy_to_ranks(x, mesh)  # f: identity; backward sums dL/dx over the ranks
        if isinstance(context, torch.Tensor):
            context = _copy_to_ranks(context, mesh)
        y, w = self.heads(x, context, causal=causal, mask=mask, need_weights=need_weights, cache=cache)
        y = _sum_over_ranks(y, mesh)  # g: all-reduce; backward passes dL/dy through
        if self.out_bias is not None:
            y = y + self.out_bias  # once, after the sum (every rank adding it would count it N times)
        return y, w

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


def shard_heads(module: MultiHeadAttention, group: dist.ProcessGroup | None = None) -> ShardedMultiHeadAttention:
    """This rank's shard of ``module``: h/N of its heads, run in parallel with the other ranks.

    Call it on every rank of ``group`` (default: the world group) after
    ``torch.distributed.init_process_group``, with the same module on every
    rank (same weights: build it from one seed or load one checkpoint). The
    shard copies its weights, so ``module`` can be deleted afterwards.

    Rank r of N keeps the rows of W_Q, W_K and W_V of its heads
    (:func:`qkv_rows`) and the matching columns of W_O (:func:`out_columns`):
    each rank holds 1/N of the layer's weights (W_O's bias is replicated).
    Its forward has the full module's signature and returns the full
    (B, T, d_model) y, after one sum all-reduce of B*T*d_model values, plus
    the weights of its own heads, (B, h/N, T, S). Forward and backward equal
    the unsharded module's: if every rank computes the same loss from y,
    the shard's parameter gradients are the matching slices of the full
    module's gradients, and x's gradient is the full one on every rank (one
    more all-reduce in the backward pass). With dropout in training mode the
    ranks draw different masks, as separate heads would.

    Works on any backend: gloo on CPU, NCCL with one process per GPU (move
    the module to the rank's GPU before sharding).

    Source: Shoeybi et al. 2019, "Megatron-LM", §3 (Figure 3b); the
    communication uses ``torch.distributed.tensor`` (DTensor) placements.

    Raises:
        TypeError: module is not an ``mha.MultiHeadAttention``.
        RuntimeError: the process group is not initialised.
        ValueError: N does not divide h, or does not divide n_kv_heads
            (names the numbers).
    """
    return ShardedMultiHeadAttention(module, group)


def run_on_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    backend: str = "gloo",
    timeout: float = 60.0,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` new local processes joined in one process group.

    Each process is one rank: ``torch.distributed`` is initialised in it
    (``dist.get_rank()`` tells ``fn`` which one it is), ``fn(*args)`` runs,
    and the process group is destroyed. Returns ``[result of rank 0, result
    of rank 1, ...]``; results (and args) must be picklable, and tensors are
    copied back.

    Args:
        fn: the function every rank runs.
        *args: its arguments, the same on every rank.
        world_size: N, the number of processes.
        backend: "gloo" (CPU); "nccl" needs one GPU per rank, and rank r
            uses GPU r (``torch.cuda.set_device(r)`` is called for it).
        timeout: seconds for the whole run, and for each collective.
        start_method: "spawn" (fresh interpreters) or "fork" (copies of this
            one; POSIX only). Default: "spawn" when ``fn`` can be imported
            from a module, else "fork" -- functions defined in a notebook or
            in ``__main__`` cannot be pickled for spawn. Forked ranks run
            torch on one thread (OpenMP is not fork-safe) and must not use
            CUDA if this process already did.

    The rendezvous store listens on a free port the operating system picks,
    in this process, so concurrent runs never collide.

    Raises:
        The exception a rank raised (its type and message), with the rank's
        traceback attached as its ``__cause__``; RuntimeError for a rank that
        died without one (a signal or ``os._exit``); TimeoutError when the run
        takes longer than ``timeout``. Every rank is stopped before it raises.
    """
    check_int(world_size=world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    if start_method is None:
        start_method = "spawn" if _importable(fn) else "fork"
    if start_method not in torch_mp.get_all_start_methods():
        raise ValueError(
            f"start_method {start_method!r} is not available here (have {torch_mp.get_all_start_methods()}); "
            f"functions defined in a notebook or __main__ need 'fork', so define {fn!r} in a module"
        )
    if start_method != "fork" and not _importable(fn):
        raise ValueError(
            f"start_method {start_method!r} starts fresh interpreters that import fn by name, but {fn!r} "
            f"is defined in __main__, a notebook or another function; move it into a module or use 'fork'"
        )
    if start_method == "fork":
        # Import DTensor (and the torch._dynamo it loads on first use, about 1 s) once here,
        # so the forked ranks inherit it instead of each importing it again.
        import torch._dynamo  # noqa: F401
        import torch.distributed.tensor  # noqa: F401
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    ctx = torch_mp.get_context(start_method)
    reports, report = ctx.Pipe(duplex=False)  # every rank sends one report; this process reads them
    lock = ctx.Lock()
    procs = torch_mp.start_processes(
        _rank_main, args=(world_size, backend, store.port, timeout, start_method, (report, lock), fn, args),
        nprocs=world_size, join=False, start_method=start_method,
    )
    try:
        return _collect(procs.processes, reports, world_size, time.monotonic() + timeout, timeout)
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
            p.join()
        reports.close()
        report.close()
        del store  # stops the rendezvous server


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
    h, g = module.h, module.n_kv_heads
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


def _some_heads(module: MultiHeadAttention, rank: int, world_size: int) -> MultiHeadAttention:
    """A MultiHeadAttention that holds only ``rank``'s heads (d_k unchanged) and no W_O bias.

    It is built as the full layer on the meta device (so every attribute the
    class sets exists), then given h/N heads and real, sliced weights; its
    forward is the class's own, unchanged: no attention math is repeated here.
    """
    weight = module.qkv.weight
    has_bias = module.qkv.bias is not None
    # Built on the meta device and then given uninitialised memory: no random initialisation,
    # so making a shard does not move the random number generator (the caller's next
    # torch.randn is the same with and without it).
    local = MultiHeadAttention(
        module.d_model, module.h, n_kv_heads=module.n_kv_heads, bias=has_bias,
        dropout=module.dropout, device="meta", dtype=weight.dtype,
    )
    h, g, d_k = module.h // world_size, module.n_kv_heads // world_size, module.d_k
    local.h, local.n_kv_heads = h, g
    local._widths = [h * d_k, g * d_k, g * d_k]  # rows of this rank's W_Q, W_K, W_V in its qkv
    rows, cols = qkv_rows(module, rank, world_size), out_columns(module, rank, world_size)
    local.qkv = nn.Linear(module.d_model, len(rows), bias=has_bias, device="meta", dtype=weight.dtype)
    local.out = nn.Linear(len(cols), module.d_model, bias=False, device="meta", dtype=weight.dtype)
    local.to_empty(device=weight.device)
    with torch.no_grad():
        local.qkv.weight.copy_(weight[rows.to(weight.device)])
        if has_bias:
            local.qkv.bias.copy_(module.qkv.bias[rows.to(weight.device)])
        local.out.weight.copy_(module.out.weight[:, cols.to(weight.device)])
    for mine, theirs in ((local.qkv.weight, weight), (local.qkv.bias, module.qkv.bias),
                         (local.out.weight, module.out.weight)):
        if mine is not None:
            mine.requires_grad_(theirs.requires_grad)  # frozen stays frozen
    local.train(module.training)
    return local


def _copy_to_ranks(t, mesh):
    """Megatron's f: identity forward; backward all-reduces the partial input gradients."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    return DTensor.from_local(t, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def _sum_over_ranks(t, mesh):
    """Megatron's g: all-reduce (sum) forward; backward passes the (replicated) gradient through."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    return DTensor.from_local(t, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()]).to_local()


def _importable(fn) -> bool:
    module = getattr(fn, "__module__", None)
    if module in (None, "__main__") or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        return False
    try:
        pickle.dumps(fn)
    except Exception:
        return False
    return True


def _rank_main(rank, world_size, backend, port, timeout, start_method, report, fn, args):
    """What every child process runs (the target of torch.multiprocessing.start_processes)."""
    if start_method == "fork":
        torch.set_num_threads(1)  # the parent's OpenMP pool does not survive fork
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        wait = datetime.timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=wait)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=wait)
        message = (rank, True, pickle.dumps(fn(*args)))
    except BaseException as exc:  # noqa: B036 -- report everything, even KeyboardInterrupt, to the parent
        message = (rank, False, (_picklable(exc), traceback.format_exc()))
    # Report before tearing down: a failing rank's exit makes the others' collectives fail too, and
    # the parent must read the first cause, not its echoes. The pipe keeps this order.
    connection, lock = report
    with lock:
        connection.send(message)
    if dist.is_initialized():
        dist.destroy_process_group()


def _picklable(exc):
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        return None
    return blob


class _RankTraceback(Exception):
    """The traceback of an exception raised on another rank (like concurrent.futures' _RemoteTraceback)."""

    def __str__(self):
        return self.args[0]


def _collect(processes, reports, world_size, deadline, timeout):
    done: dict[int, Any] = {}
    while len(done) < world_size:
        if not reports.poll(0.05):
            dead = [r for r, p in enumerate(processes) if r not in done and p.exitcode is not None]
            if dead and not reports.poll(1.0):  # a moment for a report still on its way
                codes = ", ".join(f"rank {r} exit code {processes[r].exitcode}" for r in dead)
                raise RuntimeError(f"a rank died without reporting a result ({codes})")
            if not dead and time.monotonic() > deadline:
                missing = [r for r in range(world_size) if r not in done]
                raise TimeoutError(f"ranks {missing} of {world_size} did not finish within timeout={timeout} s")
            if not reports.poll(0):
                continue
        rank, ok, payload = reports.recv()
        if not ok:
            blob, text = payload
            cause = _RankTraceback(f"\n\nrank {rank} of {world_size} raised:\n{text}")
            exc = pickle.loads(blob) if blob is not None else RuntimeError(f"rank {rank} of {world_size} failed")
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised on rank {rank} of {world_size}; its traceback is above)")
            raise exc from cause
        done[rank] = pickle.loads(payload)
    return [done[r] for r in range(world_size)]
