"""Benchmark mha's attention paths against PyTorch, on GPT-2-small attention.

    python benchmarks/attention.py --smoke                  # seconds: proves it runs (CI)
    python benchmarks/attention.py                          # the full run: minutes on 2 cores
    python benchmarks/attention.py --output benchmarks/RESULTS.md --json mha/data/benchmark_results.json

The JSON ships inside the package (``mha/data/benchmark_results.json``), so notebook 06 can plot
the recorded run wherever it opens, Colab included, through ``importlib.resources``.

What is compared (d_model 768, h 12, batch B, causal self-attention, float32):

* ``mha explicit``: ``mha.MultiHeadAttention``, need_weights=True (builds the T x T table);
* ``mha fused``: the same module, need_weights=False (``F.scaled_dot_product_attention``);
* ``torch weights``: ``nn.MultiheadAttention(batch_first=True)``, need_weights=True,
  average_attn_weights=False, with the causal mask from ``mha.to_torch_attn_mask``;
* ``torch fused``: the same module, need_weights=False, the same mask plus is_causal=True;
* ``reference``: the least a fused layer can do: one Linear, ``F.scaled_dot_product_attention
  (is_causal=True)``, one Linear. It is the practical limit on this hardware, and every time
  is printed as a ratio to it, measured in the same run.

All five get the same weights, and are checked to give the same outputs before anything is
timed. "forward" is inference (``torch.no_grad()``, eval mode: ``nn.MultiheadAttention`` may
take its native fast path); "forward+backward" is a training step's share (train mode,
dropout 0, x requires grad, backward with a fixed output gradient).

Timing uses ``torch.utils.benchmark.Timer.blocked_autorange`` with a fixed thread count. The
machine may be shared, so every case is measured in several interleaved rounds and the
fastest block is kept (other work can only add time); the round medians go to the JSON.

Also measured: decoding N tokens one at a time with ``mha.KVCache`` against recomputing the
whole prefix at every step, and the peak memory of each path at a long T (see
``peak_bytes`` for how it is measured on CPU and on GPU).

And one decoding step, where a layer's fixed costs show: the per-token latency of an N-token
generation (one token per call, from an empty cache) at d_model 768 (h 12) and d_model 64 (h 4),
for ``mha.MultiHeadAttention`` with ``KVCache(max_len=N)`` and with ``KVCache()``, as a ratio to
``MinimalDecoder``: one Linear, ``F.scaled_dot_product_attention`` over a preallocated K/V cache,
one Linear, measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.benchmark import Timer

import mha

IMPLS = ["reference", "mha fused", "mha explicit", "torch fused", "torch weights"]
MODES = ["forward", "forward+backward"]


@dataclass
class Config:
    d_model: int = 768
    h: int = 12
    batch: int = 1
    lengths: tuple[int, ...] = (128, 512, 1024)
    decode_tokens: int = 512
    decode_sizes: tuple[tuple[int, int], ...] = ((768, 12), (64, 4))  # (d_model, h) of the decode-step timing
    memory_T: int = 4096
    min_run_time: float = 0.5
    rounds: int = 5
    threads: int = 2
    smoke: bool = False


SMOKE = dict(d_model=64, h=4, lengths=(16,), decode_tokens=16, memory_T=256, min_run_time=0.01, rounds=1)


# --------------------------------------------------------------------------- the five layers


class MinimalFused(nn.Module):
    """One Linear for Q, K, V; F.scaled_dot_product_attention(is_causal=True); one Linear."""

    def __init__(self, d_model: int, h: int, device=None, dtype=None) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.out = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d_k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
        return self.out(o.transpose(1, 2).reshape(B, T, D))  # (B, T, d_model)


def build_layers(cfg: Config, device: torch.device):
    """The three modules, sharing one set of weights."""
    ours = mha.MultiHeadAttention(cfg.d_model, cfg.h, device=device)
    theirs = mha.to_torch(ours)
    ref = MinimalFused(cfg.d_model, cfg.h, device=device)
    ref.load_state_dict(ours.state_dict())  # same names: qkv.weight, qkv.bias, out.weight, out.bias
    return ours, theirs, ref


def calls(ours, theirs, ref, x: torch.Tensor):
    """name -> a function of no arguments that returns the layer's output (B, T, d_model)."""
    T = x.size(1)
    blocked = mha.to_torch_attn_mask(mha.causal_mask(T, device=x.device))  # True = blocked, (T, T)
    return {
        "reference": lambda: ref(x),
        "mha fused": lambda: ours(x, need_weights=False)[0],
        "mha explicit": lambda: ours(x, need_weights=True)[0],
        "torch fused": lambda: theirs(x, x, x, attn_mask=blocked, need_weights=False, is_causal=True)[0],
        "torch weights": lambda: theirs(
            x, x, x, attn_mask=blocked, need_weights=True, average_attn_weights=False
        )[0],
    }


def check_agreement(ours, theirs, ref, cfg: Config, device: torch.device) -> None:
    """All five compute the same function (and both weights tables agree): like is compared with like."""
    T = min(cfg.lengths)
    x = torch.randn(cfg.batch, T, cfg.d_model, device=device)
    for training in (True, False):  # eval mode is where nn.MultiheadAttention takes its fast path
        for m in (ours, theirs, ref):
            m.train(training)
        with torch.no_grad():
            outs = {name: f() for name, f in calls(ours, theirs, ref, x).items()}
            _, w_ours = ours(x, need_weights=True)
            _, w_theirs = theirs(
                x, x, x, attn_mask=mha.to_torch_attn_mask(mha.causal_mask(T, device=device)),
                average_attn_weights=False,
            )
        for name, y in outs.items():
            if not torch.allclose(y, outs["reference"], atol=1e-5, rtol=1e-4):
                diff = (y - outs["reference"]).abs().max()
                raise AssertionError(f"{name} differs from the reference by {diff} (training={training})")
        if not torch.allclose(w_ours, w_theirs, atol=1e-6):
            raise AssertionError(f"mha and nn.MultiheadAttention weights differ (training={training})")
    for m in (ours, theirs, ref):
        m.eval()


# --------------------------------------------------------------------------- timing


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
    """N tokens one at a time: with a KVCache vs recomputing the whole prefix at every step."""
    N = cfg.decode_tokens
    x = torch.randn(cfg.batch, N, cfg.d_model, device=device)
    ours.eval()

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


# --------------------------------------------------------------------------- one decoding step

DECODE_IMPLS = ["minimal", "mha KVCache(max_len)", "mha KVCache()"]
DECODE_GOALS = {768: 1.10, 64: 1.30}  # d_model -> most time per token, as a multiple of the minimal step


class MinimalDecoder(nn.Module):
    """The least one decoding step can do: one Linear for Q, K, V, ``F.scaled_dot_product_attention``
    over a preallocated K/V cache, one Linear. No checks and no options."""

    def __init__(self, d_model: int, h: int, device=None, dtype=None) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.out = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int) -> torch.Tensor:
        """x (B, 1, d_model), the token at position ``pos``; caches (B, h, max_len, d_k), filled up to ``pos``."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, 1, d_k)
        k_cache[:, :, pos : pos + T] = k
        v_cache[:, :, pos : pos + T] = v
        # The one new token is the last position: it attends to every cached key, so there is no mask.
        o = F.scaled_dot_product_attention(q, k_cache[:, :, : pos + T], v_cache[:, :, : pos + T])  # (B, h, 1, d_k)
        return self.out(o.transpose(1, 2).reshape(B, T, D))  # (B, 1, d_model)


def generations(ours, ref: MinimalDecoder, x: torch.Tensor) -> dict:
    """name -> a function that feeds x (B, N, d_model) in one token per call, from an empty cache,
    and returns the N outputs, each (B, 1, d_model)."""
    B, N, d_model = x.shape
    h = ref.h

    def minimal():
        k_cache = x.new_empty(B, h, N, d_model // h)  # allocated per generation, as mha's preallocated cache is
        v_cache = x.new_empty(B, h, N, d_model // h)
        return [ref(x[:, t : t + 1], k_cache, v_cache, t) for t in range(N)]

    def with_cache(max_len):
        def run():
            cache = mha.KVCache(max_len=max_len)
            return [ours(x[:, t : t + 1], cache=cache, need_weights=False)[0] for t in range(N)]
        return run

    return {"minimal": minimal, "mha KVCache(max_len)": with_cache(N), "mha KVCache()": with_cache(None)}


def time_decode_steps(cfg: Config, device: torch.device) -> dict:
    """{d_model: {"h": h, impl: summarise(...) of a whole generation, "round_ratios": [...]}}.

    "round_ratios": in each round, the fastest block of mha with KVCache(max_len) over the fastest
    block of the minimal step; their spread shows how much the machine moved the ratio.
    """
    N = cfg.decode_tokens
    cases = []
    for d_model, h in cfg.decode_sizes:
        ours = mha.MultiHeadAttention(d_model, h, device=device).eval()
        ref = MinimalDecoder(d_model, h, device=device).eval()
        ref.load_state_dict(ours.state_dict())  # same names: qkv.weight, qkv.bias, out.weight, out.bias
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


# --------------------------------------------------------------------------- memory


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


# --------------------------------------------------------------------------- report


def target_rows(cfg: Config, timing: dict, decoding: dict, steps: dict, memory: dict) -> list[dict]:
    T = max(cfg.lengths)
    rows = []
    for mode in MODES:
        t = {name: v["s"] for name, v in timing[mode][T].items()}
        for ours, theirs, goal in (
            ("mha fused", "reference", 1.05), ("mha fused", "torch fused", 1.0),
            ("mha explicit", "torch weights", 1.0),
        ):
            ratio = t[ours] / t[theirs]
            rows.append(dict(target=f"time {ours} / {theirs}, {mode}, T={T}",
                             value=ratio, goal=f"<= {goal:.2f}", ok=ratio <= goal))
    speedup = decoding["recompute"]["s"] / decoding["kv cache"]["s"]
    rows.append(dict(target=f"KV-cache speed-up over recomputing, {cfg.decode_tokens} tokens",
                     value=speedup, goal=">= 10", ok=speedup >= 10))
    N = cfg.decode_tokens
    for d_model, row in steps.items():
        if d_model in DECODE_GOALS:
            ratio, goal = row["mha KVCache(max_len)"]["s"] / row["minimal"]["s"], DECODE_GOALS[d_model]
            target = f"decode step mha KVCache(max_len) / minimal, d_model={d_model}, h={row['h']}, {N} tokens"
            rows.append(dict(target=target, value=ratio, goal=f"<= {goal:.2f}", ok=ratio <= goal))
    for mode in MODES:
        frac = memory[mode]["mha fused"] / memory[mode]["mha explicit"]
        rows.append(dict(target=f"peak memory mha fused / mha explicit, {mode}, T={cfg.memory_T}",
                         value=frac, goal="<= 0.25", ok=frac <= 0.25))
    return rows


def machine(cfg: Config, device: torch.device) -> dict:
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
        model = names[0] if names else model
    except (OSError, subprocess.CalledProcessError):
        pass
    info = {
        "cpu": model,
        "cores": os.cpu_count(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": cfg.threads,
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = round(os.getloadavg()[0], 2)
    return info


def ms(s: float) -> str:
    return f"{1e3 * s:.2f} ms" if s < 1 else f"{s:.2f} s"


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 10 * 2**20 else f"{nbytes / 2**20:.2f} MiB"


def us(s: float) -> str:
    return f"{1e6 * s:.1f} µs"


def markdown(cfg: Config, info: dict, timing: dict, decoding: dict, steps: dict, memory: dict, targets: list) -> str:
    title = "# Attention benchmark" + (" (smoke configuration: numbers mean nothing)" if cfg.smoke else "")
    lines = [title, ""]
    lines += [
        f"- machine: {info['cpu']}, {info['cores']} cores; device: {info['device']}",
        f"- torch {info['torch']}, python {info['python']}, threads: {info['threads']}, date: {info['date']}",
        f"- load average (1 min) at start / end: {info.get('load_average_at_start', '?')} / "
        f"{info.get('load_average_at_end', '?')} (other jobs on the machine slow every case alike "
        "within a round, but add noise)",
        f"- layer: d_model={cfg.d_model}, h={cfg.h}, B={cfg.batch}, causal self-attention, float32",
        f"- each time: the fastest block of {cfg.rounds} interleaved rounds of torch.utils.benchmark "
        f"blocked_autorange (min_run_time={cfg.min_run_time} s each); other jobs only ever add time, and "
        "the same rule is applied to every implementation (round medians are in the JSON)",
        "",
        "Columns: reference = Linear + F.scaled_dot_product_attention(is_causal=True) + Linear; "
        "mha fused/explicit = mha.MultiHeadAttention with need_weights=False/True; "
        "torch fused/weights = nn.MultiheadAttention with need_weights=False (+ is_causal=True) / "
        "need_weights=True, average_attn_weights=False. "
        "Each cell: time (ratio to the reference measured in the same run).",
        "",
    ]
    for mode in MODES:
        note = "torch.no_grad(), eval mode" if mode == "forward" else "train mode, backward of a fixed grad"
        lines += [f"## Time: {mode} ({note})", ""]
        lines.append("| T | " + " | ".join(IMPLS) + " |")
        lines.append("|---:|" + "---:|" * len(IMPLS))
        for T, row in timing[mode].items():
            ref = row["reference"]["s"]
            cells = [f"{ms(row[n]['s'])} ({row[n]['s'] / ref:.2f}x)" for n in IMPLS]
            lines.append(f"| {T} | " + " | ".join(cells) + " |")
        lines.append("")
    N = cfg.decode_tokens
    kv, re_ = decoding["kv cache"]["s"], decoding["recompute"]["s"]
    lines += [
        f"## Decoding {N} tokens one at a time (torch.no_grad(), need_weights=False)",
        "",
        "| method | total | per token | ratio to KV cache |",
        "|---|---:|---:|---:|",
        f"| mha.KVCache (one new token per call) | {ms(kv)} | {ms(kv / N)} | 1.00x |",
        f"| recompute the whole prefix every step | {ms(re_)} | {ms(re_ / N)} | {re_ / kv:.1f}x |",
        "",
        "Both give the same outputs as one causal call over the whole sequence (checked, atol 1e-5).",
        "",
        f"## Decode step: time per token over a {N}-token generation "
        f"(torch.no_grad(), need_weights=False, B={cfg.batch})",
        "",
        "One token per call, from an empty cache. minimal = one Linear, F.scaled_dot_product_attention over a "
        "preallocated K/V cache, one Linear, with no checks; mha = mha.MultiHeadAttention with "
        f"KVCache(max_len={N}) (preallocated, written in place) or KVCache() (concatenated at every step). "
        "Each cell: time per token (ratio to minimal, same run). Per round: the ratio of mha with "
        "KVCache(max_len) to minimal in each round (fastest block of each), lowest and highest.",
        "",
        "| d_model, h | " + " | ".join(DECODE_IMPLS) + " | per round |",
        "|---|" + "---:|" * (len(DECODE_IMPLS) + 1),
    ]
    for d_model, row in steps.items():
        ref = row["minimal"]["s"]
        cells = [f"{us(row[n]['s'] / N)} ({row[n]['s'] / ref:.2f}x)" for n in DECODE_IMPLS]
        spread = f"{min(row['round_ratios']):.2f}-{max(row['round_ratios']):.2f}x"
        lines.append(f"| {d_model}, {row['h']} | " + " | ".join(cells) + f" | {spread} |")
    lines += [
        "",
        "All three give the same outputs as one causal call over the whole sequence (checked, atol 1e-5).",
        "",
    ]
    T = cfg.memory_T
    how = (
        "torch.cuda.max_memory_allocated() minus the memory allocated before the call"
        if info["device"] != "cpu" else
        "torch.profiler(profile_memory=True) records every allocation and free of PyTorch's CPU "
        "allocator during the call; the running total, replayed in time order, peaks at this value"
    )
    table_bytes = cfg.batch * cfg.h * T * T * 4
    lines += [
        f"## Peak memory at T = {T}",
        "",
        "Memory allocated by one call above what existed before it (inputs and parameters not counted): "
        f"{how}.",
        f"For scale: one float32 (B, h, T, T) table of weights or scores is {mib(table_bytes)}; "
        f"the output (B, T, d_model) is {mib(cfg.batch * T * cfg.d_model * 4)}.",
        "",
        "| mode | " + " | ".join(IMPLS) + " |",
        "|---|" + "---:|" * len(IMPLS),
    ]
    for mode in MODES:
        ref = memory[mode]["reference"]
        cells = [f"{mib(memory[mode][n])} ({memory[mode][n] / ref:.2f}x)" for n in IMPLS]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    heading = "## Targets" + (" (smoke configuration: overheads dominate, not meaningful)" if cfg.smoke else "")
    lines += ["", heading, "", "| target | measured | goal | result |", "|---|---:|---:|---|"]
    for row in targets:
        result = "PASS" if row["ok"] else "MISS"
        lines.append(f"| {row['target']} | {row['value']:.3f} | {row['goal']} | {result} |")
    lines.append("")
    return "\n".join(lines)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--lengths", type=int, nargs="+", help="sequence lengths T (default 128 512 1024)")
    p.add_argument("--rounds", type=int, help="interleaved timing rounds (default 5)")
    p.add_argument("--min-run-time", type=float, help="seconds per blocked_autorange (default 0.5)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true",
                   help="tiny configuration (d_model 64, h 4, T 16, decode 16 tokens, memory at T 256): seconds")
    p.add_argument("--output", type=Path, help="also write the Markdown report to this file")
    p.add_argument("--json", type=Path,
                   help="also write every number to this file (mha/data/benchmark_results.json is the recorded run "
                   "that notebook 06 plots)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    cfg = Config(threads=args.threads, batch=args.batch, **(SMOKE if args.smoke else {}), smoke=args.smoke)
    for field in ("lengths", "rounds", "min_run_time"):
        if getattr(args, field) is not None:
            setattr(cfg, field, tuple(args.lengths) if field == "lengths" else getattr(args, field))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    info = machine(cfg, device)

    layers = build_layers(cfg, device)
    check_agreement(*layers, cfg, device)
    timing = time_layers(cfg, device, layers)
    decoding = time_decoding(cfg, device, layers[0])
    steps = time_decode_steps(cfg, device)
    memory = measure_memory(cfg, device, layers)
    targets = target_rows(cfg, timing, decoding, steps, memory)
    if hasattr(os, "getloadavg"):
        info["load_average_at_end"] = round(os.getloadavg()[0], 2)

    report = markdown(cfg, info, timing, decoding, steps, memory, targets)
    print(report)
    if args.output:
        args.output.write_text(report)
    results = {
        "machine": info,
        "config": asdict(cfg),
        "impls": IMPLS,
        "time_s": {mode: {str(T): row for T, row in timing[mode].items()} for mode in MODES},
        "decode_s": decoding,
        "decode_step_s": {str(d_model): row for d_model, row in steps.items()},
        "peak_bytes": memory,
        "targets": targets,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
