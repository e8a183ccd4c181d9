"""The head view's data: every layer's weights in thousandths, as the JSON its script reads.

Up to :data:`DENSE_LIMIT` weights the JSON holds every one, table by table (``"w"``: per head, per query,
per key). Beyond that (12 heads on 512 tokens are 3.1 million weights, 7 MB of such JSON) it holds each
query row's weights from a floor up, and the row's largest, as [key, weight, key, weight, ...] lists
(``"rows"``). The floor starts at 0.010, below which the view draws no line and a cell is invisible anyway,
and rises (0.020, 0.050, ...) until at most :data:`SPARSE_BUDGET` weights are kept, so the output stays
small (case C16); the view says what it left out. Nothing here is random or depends on the machine.
"""

from __future__ import annotations

import torch

DENSE_LIMIT = 250_000  # weights stored one by one up to this many: 12 layers x 12 heads x 40 tokens
SPARSE_BUDGET = 250_000  # weights kept at most in a larger view, about 2 MB of JSON
FLOORS = (10, 20, 50, 100, 200, 500)  # thousandths


def layers_data(weights: list[torch.Tensor], names: list[str]) -> tuple[list[dict], str | None]:
    """The ``"layers"`` of the view's JSON, and a note saying what was left out (None: nothing)."""
    total = sum(w.numel() for w in weights)
    if total <= DENSE_LIMIT:
        return [{"name": n, "w": w.tolist()} for n, w in zip(names, weights)], None
    keep = [None] * len(weights)
    for floor in FLOORS:
        keep = [_kept(w, floor) for w in weights]
        kept = sum(int(k.sum()) for k in keep)
        if kept <= SPARSE_BUDGET:
            break
    layers = [{"name": n, "rows": _rows(w, k)} for n, w, k in zip(names, weights, keep)]
    note = (
        f"Large view: weights below {floor / 1000:.3f} are left out of its data (each row keeps its largest): "
        f"{kept:,} of {total:,} weights kept."
    )
    return layers, note


def _kept(w: torch.Tensor, floor: int) -> torch.Tensor:
    """(h, T, S) bool: the weights at or above the floor, and each row's largest (its first, on a tie)."""
    top = w.argmax(-1, keepdim=True)
    largest = torch.zeros_like(w, dtype=torch.bool).scatter_(-1, top, w.gather(-1, top) > 0)  # not an all-0 row's
    return (w >= floor) | largest


def _rows(w: torch.Tensor, keep: torch.Tensor) -> list[list[list[int]]]:
    """Per head, per query: [key, weight, key, weight, ...] of the kept weights, keys in order."""
    h, T, _ = w.shape
    index = keep.nonzero()  # (n, 3): head, query, key, in that (row-major) order
    flat = torch.stack([index[:, 2], w[keep]], dim=1).flatten().tolist()
    counts = keep.sum(-1).flatten().tolist()  # kept per (head, query)
    rows, start = [], 0
    for n in counts:
        rows.append(flat[start : start + 2 * n])
        start += 2 * n
    return [rows[k * T : (k + 1) * T] for k in range(h)]
