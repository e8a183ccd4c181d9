"""The head view's display at a real model's size (case C16): how long a notebook waits, and what it stores.

Displaying a ``mha.plot.head_view`` (the last expression of a cell) calls its ``_repr_mimebundle_``; the
notebook stores every part of the bundle. Measured here: the time from the weights to the bundle (making
the view and the bundle, the way Jupyter does), and the bytes of each part as the notebook stores them
(``text/html`` as UTF-8, ``image/png`` in base64). Colab's default output rate limit is 1 MB/s.

The weights have the shapes of GPT-2 small (d_model 768, h 12): a stack of untrained
``mha.MultiHeadAttention`` layers with a residual connection, on random embeddings, causal. Untrained heads
spread their weight thinly, the hardest case for the view's storage; a trained model's heads are peakier.
"""

from __future__ import annotations

import base64

import torch
from config import Config
from timing import progress, summarise
from torch.utils.benchmark import Timer

import mha
from mha.plot import head_view

# name: (layers, heads, tokens), and the goals from case C16: seconds, and megabytes of the whole output.
HEAD_VIEWS = {"GPT-2 small, one sentence": (12, 12, 24), "12 heads, 512 tokens": (1, 12, 512)}
SMOKE_HEAD_VIEWS = {"GPT-2 small, one sentence": (2, 4, 8), "12 heads, 512 tokens": (1, 4, 64)}
GOALS = {"GPT-2 small, one sentence": {"s": 1.0}, "12 heads, 512 tokens": {"s": 3.0, "MB": 3.0}}
WORDS = "the animal didn't cross the street because it was too tired , and then".split()


def attention_weights(n_layers: int, h: int, T: int, d_model: int = 768, seed: int = 0) -> list[torch.Tensor]:
    """One (h, T, T) table of causal attention weights per layer, from untrained layers with a residual."""
    torch.manual_seed(seed)
    x = torch.randn(1, T, d_model)  # (B, T, d_model): random stand-ins for embeddings
    tables = []
    with torch.no_grad():
        for _ in range(n_layers):
            y, w = mha.MultiHeadAttention(d_model, h).eval()(x)  # (1, T, d_model), (1, h, T, T)
            x = x + y
            tables.append(w[0])
    return tables


def stored_bytes(bundle: dict) -> dict:
    """Bytes of each part of a display bundle as a notebook stores it (PNG in base64)."""
    sizes = {}
    for mime, data in bundle.items():
        sizes[mime] = len(base64.b64encode(data)) if isinstance(data, bytes) else len(data.encode("utf-8"))
    return sizes


def time_head_views(cfg: Config) -> dict:
    """{name: {"layers", "h", "T", "display": summarise(...), "bytes": {mime: n}, "total_bytes"}}."""
    results = {}
    rounds = min(cfg.rounds, 3)  # each display takes seconds at these sizes
    for name, (n_layers, h, T) in (SMOKE_HEAD_VIEWS if cfg.smoke else HEAD_VIEWS).items():
        d_model = 64 * h  # GPT-2 small's d_k
        weights = attention_weights(n_layers, h, T, d_model)
        tokens = [WORDS[i % len(WORDS)] for i in range(T)]
        timer = Timer("head_view(weights, tokens)._repr_mimebundle_()", num_threads=cfg.threads,
                      globals={"head_view": head_view, "weights": weights, "tokens": tokens})
        measured = [timer.timeit(1) for _ in range(rounds)]
        sizes = stored_bytes(head_view(weights, tokens)._repr_mimebundle_())
        results[name] = {
            "layers": n_layers, "h": h, "T": T, "display": summarise(measured),
            "bytes": sizes, "total_bytes": sum(sizes.values()),
        }
        progress(f"timed the head view, {name} ({n_layers} x {h} x {T}): {results[name]['display']['s']:.2f} s, "
                 f"{sum(sizes.values()) / 1e6:.2f} MB")
    return results


def head_view_targets(views: dict) -> list[dict]:
    rows = []
    for name, row in views.items():
        size = f"{row['layers']} layer{'s' if row['layers'] != 1 else ''} x {row['h']} heads x {row['T']} tokens"
        goal = GOALS[name]
        seconds = row["display"]["s"]
        rows.append(dict(target=f"head view display time (s), {size}", value=seconds,
                         goal=f"<= {goal['s']:.2f}", ok=seconds <= goal["s"]))
        if "MB" in goal:
            mb = row["total_bytes"] / 1e6
            rows.append(dict(target=f"head view output size (MB), {size}", value=mb,
                             goal=f"<= {goal['MB']:.2f}", ok=mb <= goal["MB"]))
    return rows


def head_view_markdown(views: dict, apart: dict | None) -> list[str]:
    """The section; ``apart``: the machine info of a measurement made apart from the rest of the report."""
    when = "" if apart is None else (
        f" Measured apart from the tables above (`--only-head-view`), on {apart['date']}, "
        f"{apart['cpu']}, {apart['threads']} threads, load average {apart.get('load_average_at_start', '?')} / "
        f"{apart.get('load_average_at_end', '?')}."
    )
    lines = [
        "## Head view display (case C16)",
        "",
        "Time from the weights to the display bundle (`head_view(weights, tokens)._repr_mimebundle_()`, what "
        "Jupyter calls), the fastest of the rounds, and the bytes the notebook stores (PNG in base64). "
        "Weights: untrained GPT-2-small-shaped layers (d_k 64) on random embeddings, causal." + when,
        "",
        "| view | layers x heads x tokens | display | text/html | image/png | whole output |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, row in views.items():
        b = row["bytes"]
        png = f"{b['image/png'] / 1e6:.2f} MB" if "image/png" in b else "not drawn"
        lines.append(
            f"| {name} | {row['layers']} x {row['h']} x {row['T']} | {row['display']['s']:.2f} s | "
            f"{b['text/html'] / 1e6:.2f} MB | {png} | {row['total_bytes'] / 1e6:.2f} MB |"
        )
    return lines + [""]
