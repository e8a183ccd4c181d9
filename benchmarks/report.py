"""The report: targets (each a ratio measured in one run), the machine, and the Markdown tables."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

import torch
from config import Config
from layers import DECODE_IMPLS, IMPLS, MODES

DECODE_GOALS = {768: 1.10, 64: 1.30}  # d_model -> most time per token, as a multiple of the minimal step


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


def markdown(
    cfg: Config, info: dict, timing: dict, decoding: dict, steps: dict, memory: dict, extra: list[str], targets: list
) -> str:
    """The report; ``extra``: more sections (lines of Markdown), placed before the targets."""
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
    lines += [""] + extra
    heading = "## Targets" + (" (smoke configuration: overheads dominate, not meaningful)" if cfg.smoke else "")
    lines += [heading, "", "| target | measured | goal | result |", "|---|---:|---:|---|"]
    for row in targets:
        result = "PASS" if row["ok"] else "MISS"
        lines.append(f"| {row['target']} | {row['value']:.3f} | {row['goal']} | {result} |")
    lines.append("")
    return "\n".join(lines)
