"""Cross-attention's cost of calling ``qkv`` as a module (case C23), against mha 0.3's path, in one run.

mha 0.3 projected cross-attention by splitting ``qkv.weight`` into W_Q and [W_K; W_V] and calling ``F.linear``
on each part, so that whatever wrapped ``qkv`` (hooks, an adapter, pruning) was skipped there. mha 0.4 calls
``qkv`` as a module on x and on the context and leaves the parts it does not use: for T = S that is twice the
projection's multiply-adds. ``before`` below is 0.3's path, kept here only to measure it, with the layer's own
input checks, attention and W_O; ``after`` is the layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from config import Config
from timing import progress, summarise
from torch.utils.benchmark import Timer

import mha
from mha.attention import attend

CROSS_IMPLS = ["mha 0.3 (weights split)", "mha 0.4 (qkv called twice)"]


def before(m: mha.MultiHeadAttention, x: torch.Tensor, context: torch.Tensor, need_weights: bool):
    """mha 0.3's cross-attention: Q = F.linear(x, W_Q, b_Q), [K, V] = F.linear(context, W_KV, b_KV)."""
    m._check(x, context, None, None, need_weights)
    W_Q, W_KV = m.qkv.weight.split([m.d_model, 2 * m.d_model])
    b_Q, b_KV = m.qkv.bias.split([m.d_model, 2 * m.d_model])
    q = F.linear(x, W_Q, b_Q).unflatten(-1, (m.h, m.d_k)).transpose(1, 2)
    k, v = F.linear(context, W_KV, b_KV).unflatten(-1, (2 * m.h, m.d_k)).transpose(1, 2).chunk(2, dim=1)
    out, w = attend(q, k, v, None, need_weights=need_weights)
    return m.out(out.transpose(1, 2).flatten(2)), w


def time_cross_attention(cfg: Config, device: torch.device) -> dict:
    """{need_weights: {T: {impl: summarise(...)}}}: forward in eval mode under no_grad, S = T, interleaved rounds."""
    torch.manual_seed(0)
    m = mha.MultiHeadAttention(cfg.d_model, cfg.h, device=device).eval()
    cases = []
    for T in cfg.lengths[:2]:
        x, context = (torch.randn(cfg.batch, T, cfg.d_model, device=device) for _ in range(2))
        for need_weights in (False, True):
            with torch.no_grad():
                got, want = m(x, context, need_weights=need_weights)[0], before(m, x, context, need_weights)[0]
            assert torch.allclose(got, want, atol=1e-5), (T, need_weights, (got - want).abs().max())
            fns = {CROSS_IMPLS[0]: lambda x=x, c=context, n=need_weights: before(m, x, c, n),
                   CROSS_IMPLS[1]: lambda x=x, c=context, n=need_weights: m(x, c, need_weights=n)}
            cases += [(str(need_weights), str(T), name, fn) for name, fn in fns.items()]
    measured = {case[:3]: [] for case in cases}
    for r in range(cfg.rounds + 1):
        for nw, T, name, fn in cases:
            timer = Timer("with torch.no_grad(): fn()", globals={"fn": fn, "torch": torch}, num_threads=cfg.threads)
            m_ = timer.blocked_autorange(min_run_time=cfg.min_run_time)
            if r > 0:  # round 0 warms up
                measured[nw, T, name].append(m_)
        progress(f"cross-attention round {r} of {cfg.rounds}")
    results: dict = {}
    for (nw, T, name), ms in measured.items():
        results.setdefault(nw, {}).setdefault(T, {})[name] = summarise(ms)
    return results


def cross_markdown(cross: dict | None, apart: dict | None) -> list[str]:
    """The section (none before it was first measured); ``apart``: the machine of a measurement made apart."""
    if not cross:
        return []
    when = "" if apart is None else (
        f" Measured apart from the tables above (`--only-cross-attention`), on {apart['date']}, "
        f"{apart['cpu']}, {apart['threads']} threads, load average {apart.get('load_average_at_start', '?')} / "
        f"{apart.get('load_average_at_end', '?')}."
    )
    lines = [
        "## Cross-attention: qkv called as a module (case C23)",
        "",
        "mha.MultiHeadAttention(x, context), S = T, forward under torch.no_grad() in eval mode. mha 0.3 split "
        "qkv.weight and called F.linear on W_Q (for x) and on W_K, W_V (for the context), skipping whatever wraps "
        "qkv; mha 0.4 calls qkv on x and on the context, so that hooks and adapters act, and leaves the parts it "
        "does not use (for T = S, twice the projection's multiply-adds). Each cell: time (ratio to 0.3's path, "
        "same run)." + when,
        "",
        "| need_weights | T = S | " + " | ".join(CROSS_IMPLS) + " |",
        "|---|---:|" + "---:|" * len(CROSS_IMPLS),
    ]
    for nw, by_T in cross.items():
        for T, row in by_T.items():
            ref = row[CROSS_IMPLS[0]]["s"]
            cells = [f"{row[n]['s'] * 1e3:.2f} ms ({row[n]['s'] / ref:.2f}x)" for n in CROSS_IMPLS]
            lines.append(f"| {nw} | {T} | " + " | ".join(cells) + " |")
    return lines + [""]
