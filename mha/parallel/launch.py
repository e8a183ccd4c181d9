"""Run a function on N local processes joined by one process group (how the tests and notebook 08 run mha.parallel)."""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

__all__ = ["run_on_ranks"]


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

    The ranks meet through a ``torch.distributed.FileStore`` in a new
    temporary folder, so concurrent runs never collide. It is a file, not a
    TCPStore served from this process: a server thread here could hold a
    libc lock (the resolver's, while it names a connecting rank) at the
    moment the next rank is forked, and that rank would wait on it forever.

    Raises:
        The exception a rank raised (its type and message), with the rank's
        traceback attached as its ``__cause__``; RuntimeError for a rank that
        died without one (a signal or ``os._exit``); TimeoutError when the run
        takes longer than ``timeout``. Every rank is stopped before it raises.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
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
        # DTensor loads PyTorch's compiler stack on its first use, about 3 s in each rank. Load both once here, so
        # the forked ranks inherit them: torch.compiler.disable loads that stack, and wrapping a no-op with it has
        # no other effect (torch.compiler.reset() would also drop the caller's compiled code).
        import torch.distributed.tensor  # noqa: F401

        torch.compiler.disable(lambda: None)
    ctx = torch_mp.get_context(start_method)
    reports, report = ctx.Pipe(duplex=False)  # every rank sends one report; this process reads them
    lock = ctx.Lock()
    with tempfile.TemporaryDirectory(prefix="mha-ranks-") as folder:
        store = os.path.join(folder, "store")  # the rendezvous file; no thread in this process serves it
        procs = torch_mp.start_processes(
            _rank_main, args=(world_size, backend, store, timeout, start_method, (report, lock), fn, args),
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


# -- internals ---------------------------------------------------------------------------------------------


def _importable(fn) -> bool:
    module = getattr(fn, "__module__", None)
    if module in (None, "__main__") or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        return False
    try:
        pickle.dumps(fn)
    except Exception:
        return False
    return True


def _rank_main(rank, world_size, backend, store_path, timeout, start_method, report, fn, args):
    """What every child process runs (the target of torch.multiprocessing.start_processes)."""
    if start_method == "fork":
        torch.set_num_threads(1)  # the parent's OpenMP pool does not survive fork
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        wait = datetime.timedelta(seconds=timeout)
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(wait)
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
