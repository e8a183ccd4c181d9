"""Timing and memory: interleaved rounds of torch.utils.benchmark, the fastest block kept; peak allocations.

Other work on the machine can only add time, so each case is measured in several rounds spread over the
run, and the same rule (the fastest block) is applied to every implementation.
"""

from __future__ import annotations

import sys

import torch
from config import Config
from layers import DECODE_IMPLS, IMPLS, MODES, MinimalDecoder, calls, generations, weights
from report import mib
from torch.utils.benchmark import Timer

import mha


def statement(fn, mode: str, grad_out: torch.Tensor):
    """A no-argument function running one forward (no grad) or one forward+backward."""
    if mode == "forward":
        def run():
            with torch.no_grad():
                fn()
    else:
        def run():
            torch.autograd.backward(fn(), grad_out)
    return run


def summarise(measurements) -> dict:
    """The fastest block of all rounds ("s"), and each round's median, for the record.

    Other work on the machine can only ever add time, so the fastest block is the least
    disturbed estimate; the same rule is applied to every implementation.
    """
    return {
        "s": min(min(m.times) for m in measurements),
        "round_medians": [m.median for m in measurements],
        "blocks": sum(len(m.times) for m in measurements),
    }


def time_layers(cfg: Config, device: torch.device, layers) -> dict:
    """{mode: {T: {impl: summarise(...)}}}.

    Each round visits every (T, mode, implementation) once, so the rounds of one case are spread
    over the whole run: a burst of other work on the machine spoils a round, rarely all of them.
    """
    cases = []
    for T in cfg.lengths:
        x = torch.randn(cfg.batch, T, cfg.d_model, device=device)
        grad_out = torch.randn_like(x)
        for mode in MODES:
            x_mode = x.clone().requires_grad_(mode != "forward")
            fns = calls(*layers, x_mode)
            cases.append((mode, T, {name: statement(fns[name], mode, grad_out) for name in IMPLS}))
    measured: dict = {(mode, T, name): [] for mode, T, _ in cases for name in IMPLS}
    for r in range(cfg.rounds):
        for mode, T, stmts in cases:
            for m in layers:
                m.train(mode != "forward")
            order = IMPLS[r % len(IMPLS):] + IMPLS[: r % len(IMPLS)]  # rotate who goes first
            for name in order:
                if r == 0:  # warm up (allocator, kernels, fast-path checks)
                    stmts[name]()
                    stmts[name]()
                timer = Timer("run()", globals={"run": stmts[name]}, num_threads=cfg.threads)
                measured[mode, T, name].append(timer.blocked_autorange(min_run_time=cfg.min_run_time))
        progress(f"timing round {r + 1}/{cfg.rounds} done")
    for m in layers:
        m.zero_grad(set_to_none=True)
        m.eval()
    results: dict = {mode: {} for mode in MODES}
    for mode, T, _ in cases:
        results[mode][T] = {name: summarise(measured[mode, T, name]) for name in IMPLS}
        progress(f"timed {mode:<16} T={T:<5} " + "  ".join(
            f"{name} {1e3 * results[mode][T][name]['s']:.2f} ms" for name in IMPLS))
    return results


def time_decoding(cfg: Config, device: torch.device, ours) -> dict:
    """N tokens one at a time: with a KVCache vs recomputing the whole prefix at every step.

    ``ours``' weights decode in an ``mha.GroupedQueryAttention`` with as many K/V heads as query heads, the class
    that takes a cache: the same layer, weight for weight.
    """
    N = cfg.decode_tokens
    x = torch.randn(cfg.batch, N, cfg.d_model, device=device)
    decoder = mha.GroupedQueryAttention(cfg.d_model, cfg.h, device=device)
    decoder.load_state_dict(ours.state_dict())
    ours = decoder.eval()

    def cached():
        cache = mha.KVCache()
        return torch.cat([ours(x[:, t : t + 1], cache=cache, need_weights=False)[0] for t in range(N)], dim=1)

    def recompute():
        return torch.cat([ours(x[:, : t + 1], need_weights=False)[0][:, -1:] for t in range(N)], dim=1)

    with torch.no_grad():
        full, _ = ours(x, need_weights=False)  # one causal call over the whole sequence
        for fn in (cached, recompute):
            if not torch.allclose(fn(), full, atol=1e-5):
                raise AssertionError(f"{fn.__name__} decoding differs from the full causal call")
        rounds: dict = {"kv cache": [], "recompute": []}
        for _ in range(cfg.rounds):
            for name, fn in (("kv cache", cached), ("recompute", recompute)):
                timer = Timer("fn()", globals={"fn": fn}, num_threads=cfg.threads)
                rounds[name].append(timer.blocked_autorange(min_run_time=cfg.min_run_time))
    res = {name: summarise(v) for name, v in rounds.items()}
    progress(f"timed decoding of {N} tokens: " + "  ".join(f"{k} {v['s']:.3f} s" for k, v in res.items()))
    return res


def time_decode_steps(cfg: Config, device: torch.device) -> dict:
    """{d_model: {"h": h, impl: summarise(...) of a whole generation, "round_ratios": [...]}}.

    "round_ratios": in each round, the fastest block of mha with KVCache(max_len) over the fastest
    block of the minimal step; their spread shows how much the machine moved the ratio.
    """
    N = cfg.decode_tokens
    cases = []
    for d_model, h in cfg.decode_sizes:
        ours = mha.GroupedQueryAttention(d_model, h, device=device).eval()  # the lesson's layer, with a cache
        ref = MinimalDecoder(d_model, h, device=device).eval()
        ref.load_state_dict(weights(ours))
        x = torch.randn(cfg.batch, N, d_model, device=device)
        fns = generations(ours, ref, x)
        with torch.no_grad():
            full, _ = ours(x, need_weights=False)  # one causal call over the whole sequence
            for name, fn in fns.items():
                y = torch.cat(fn(), dim=1)
                if not torch.allclose(y, full, atol=1e-5):
                    diff = (y - full).abs().max()
                    raise AssertionError(f"{name} decoding differs from the full causal call by {diff}")
        cases.append((d_model, h, fns))
    measured: dict = {(d_model, name): [] for d_model, _, _ in cases for name in DECODE_IMPLS}
    with torch.no_grad():
        for r in range(cfg.rounds):
            k = r % len(DECODE_IMPLS)
            order = DECODE_IMPLS[k:] + DECODE_IMPLS[:k]  # rotate who goes first
            for d_model, _, fns in cases:
                for name in order:
                    timer = Timer("fn()", globals={"fn": fns[name]}, num_threads=cfg.threads)
                    measured[d_model, name].append(timer.blocked_autorange(min_run_time=cfg.min_run_time))
            progress(f"decode-step round {r + 1}/{cfg.rounds} done")
    results = {}
    for d_model, h, _ in cases:
        row = {name: summarise(measured[d_model, name]) for name in DECODE_IMPLS}
        pairs = zip(measured[d_model, "mha KVCache(max_len)"], measured[d_model, "minimal"])
        results[d_model] = {"h": h, **row, "round_ratios": [min(a.times) / min(b.times) for a, b in pairs]}
        progress(f"timed one decoding step at d_model={d_model}: " + "  ".join(
            f"{name} {1e6 * row[name]['s'] / N:.1f} us" for name in DECODE_IMPLS))
    return results


def peak_bytes(fn, device: torch.device) -> int:
    """Peak memory allocated while ``fn()`` runs, above what was allocated when it started.

    GPU: ``torch.cuda.max_memory_allocated()`` minus the allocation at the start.
    CPU: PyTorch has no CPU allocation counter, so ``torch.profiler`` (profile_memory=True)
    records every allocation and free made by PyTorch's CPU allocator; replaying them in time
    order gives the running total, and its maximum is the peak. Inputs and parameters exist
    before the call, so they are not counted; the memory of everything the call creates
    (intermediates, saved activations, gradients) is.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    total = peak = 0
    for _, nbytes in events:
        total += nbytes
        peak = max(peak, total)
    return peak


def measure_memory(cfg: Config, device: torch.device, layers) -> dict:
    """{mode: {impl: bytes}} at T = cfg.memory_T."""
    T = cfg.memory_T
    x = torch.randn(cfg.batch, T, cfg.d_model, device=device)
    grad_out = torch.randn_like(x)
    results: dict = {mode: {} for mode in MODES}
    for mode in MODES:
        for m in layers:
            m.train(mode != "forward")
        x.requires_grad_(mode != "forward")
        fns = calls(*layers, x)
        for name in IMPLS:
            for m in layers:
                m.zero_grad(set_to_none=True)
            x.grad = None
            results[mode][name] = peak_bytes(statement(fns[name], mode, grad_out), device)
        progress(f"measured memory {mode:<16} T={T}: " + "  ".join(
            f"{name} {mib(results[mode][name])}" for name in IMPLS))
    for m in layers:
        m.zero_grad(set_to_none=True)
        m.eval()
    return results


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
