"""Benchmark mha's attention paths against PyTorch, on GPT-2-small attention.

    python benchmarks/attention.py --smoke                  # seconds: proves it runs (CI)
    python benchmarks/attention.py                          # the full run: minutes on 2 cores
    python benchmarks/attention.py --output benchmarks/RESULTS.md --json mha/data/benchmark_results.json
    python benchmarks/attention.py --only-head-view --output ... --json ...  # the head view into a recorded run

The script is split by job: ``layers.py`` (the layers compared, with one set of weights, and the calls
timed), ``timing.py`` (interleaved rounds, peak memory), ``report.py`` (targets, the machine, the Markdown).

The JSON ships inside the package (``mha/data/benchmark_results.json``), so notebook 07 can plot
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

And cross-attention against mha 0.3's way of projecting it (``cross.py``, case C23), at the two shorter T.

And the head view's display at a real model's size (``display.py``, case C16): the time from the weights
to the display bundle, and the bytes a notebook stores, for GPT-2 small's 12 layers x 12 heads on one
24-token sentence, and 12 heads on 512 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import torch
from config import SMOKE, Config
from cross import cross_markdown, time_cross_attention
from display import head_view_markdown, head_view_targets, time_head_views
from layers import IMPLS, MODES, build_layers, check_agreement
from report import machine, markdown, target_rows
from timing import measure_memory, time_decode_steps, time_decoding, time_layers


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
                   "that notebook 07 plots)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only-head-view", action="store_true",
                   help="measure only the head view's display and put it into the run recorded in --json, whose "
                   "other numbers stay as measured (the report says when each part was)")
    p.add_argument("--only-cross-attention", action="store_true",
                   help="measure only cross-attention against mha 0.3's path, into the run recorded in --json")
    args = p.parse_args(argv)
    for only in ("only_head_view", "only_cross_attention"):
        if getattr(args, only) and not (args.json and args.json.exists()):
            p.error(f"--{only.replace('_', '-')} needs --json naming a recorded run to put the new measurement into")

    cfg = Config(threads=args.threads, batch=args.batch, **(SMOKE if args.smoke else {}), smoke=args.smoke)
    for field in ("lengths", "rounds", "min_run_time"):
        if getattr(args, field) is not None:
            setattr(cfg, field, tuple(args.lengths) if field == "lengths" else getattr(args, field))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    info = machine(cfg, device)
    if args.only_head_view or args.only_cross_attention:
        return merge_apart(args, cfg, info)

    layers = build_layers(cfg, device)
    check_agreement(*layers, cfg, device)
    timing = time_layers(cfg, device, layers)
    decoding = time_decoding(cfg, device, layers[0])
    steps = time_decode_steps(cfg, device)
    memory = measure_memory(cfg, device, layers)
    views = time_head_views(cfg)
    cross = time_cross_attention(cfg, device)
    targets = target_rows(cfg, timing, decoding, steps, memory) + head_view_targets(views)
    if hasattr(os, "getloadavg"):
        info["load_average_at_end"] = round(os.getloadavg()[0], 2)

    extra = head_view_markdown(views, None) + cross_markdown(cross, None)
    report = markdown(cfg, info, timing, decoding, steps, memory, extra, targets)
    results = {
        "machine": info,
        "config": asdict(cfg),
        "impls": IMPLS,
        "time_s": {mode: {str(T): row for T, row in timing[mode].items()} for mode in MODES},
        "decode_s": decoding,
        "decode_step_s": {str(d_model): row for d_model, row in steps.items()},
        "peak_bytes": memory,
        "head_view": views,
        "head_view_machine": info,
        "head_view_apart": False,
        "cross_attention": cross,
        "cross_attention_machine": info,
        "cross_attention_apart": False,
        "targets": targets,
    }
    return write(args, report, results)


def merge_apart(args, cfg: Config, info: dict) -> dict:
    """Measure the head view's display, or cross-attention, again, into the run recorded in ``args.json``, and
    rewrite its report.

    For when one part changes and the layer timings need not (or the machine is too busy for them to be
    measured well). The report says when each part was measured.
    """
    results = json.loads(args.json.read_text())
    recorded = Config(**{k: tuple(map(tuple, v)) if k == "decode_sizes" else tuple(v) if isinstance(v, list) else v
                         for k, v in results["config"].items()})
    recorded = replace(recorded, threads=cfg.threads)
    if args.only_head_view:
        views = time_head_views(recorded)
        targets = [row for row in results["targets"] if not row["target"].startswith("head view")]
        results.update(head_view=views, head_view_machine=info, head_view_apart=True,
                       targets=targets + head_view_targets(views))
    else:
        results.update(cross_attention=time_cross_attention(recorded, torch.device(args.device)),
                       cross_attention_machine=info, cross_attention_apart=True)
    if hasattr(os, "getloadavg"):
        info["load_average_at_end"] = round(os.getloadavg()[0], 2)
    # Flagged, not inferred from the machine info: a quick rerun can match the first run's minute and load average.
    apart = {part: results[f"{part}_machine"] if results.get(f"{part}_apart") else None
             for part in ("head_view", "cross_attention")}
    extra = (head_view_markdown(results["head_view"], apart["head_view"])
             + cross_markdown(results.get("cross_attention"), apart["cross_attention"]))
    report = markdown(recorded, results["machine"], results["time_s"], results["decode_s"], results["decode_step_s"],
                      results["peak_bytes"], extra, results["targets"])
    return write(args, report, results)


def write(args, report: str, results: dict) -> dict:
    print(report)
    if args.output:
        args.output.write_text(report)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
