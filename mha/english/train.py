"""Training notebook 06's model: random windows of the training text, AdamW, a warm-up then a cosine.

The one lever beyond plain text is ``repeat``: that share of the windows has a passage of 8 to 32 words copied
from earlier in the window to later in it, as real documents repeat names and phrases. Notebook 06 says so, and
compares a model trained with it to one trained without (``repeat=0``).
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from .model import WordLM


def batch(ids: torch.Tensor, size: int, context: int, g: torch.Generator, repeat: float = 0.0):
    """(x, y), each (size, context) int64: random windows of ``ids`` and the same shifted by one (the targets).

    With probability ``repeat`` a window has a stretch of r = 8..32 tokens (at most a quarter of the context)
    starting at s copied over the tokens at d..d+r, for some d >= s + r: from d + 1 on, the next word can be read
    off the earlier copy.
    """
    longest = min(32, context // 4)
    starts = torch.randint(0, len(ids) - context - 1, (size,), generator=g).tolist()
    chunks = torch.stack([ids[i:i + context + 1] for i in starts])  # (size, context + 1)
    for row in (torch.rand(size, generator=g) < repeat).nonzero().flatten().tolist():
        r = int(torch.randint(min(8, longest), longest + 1, (), generator=g))
        s = int(torch.randint(0, context + 1 - 2 * r, (), generator=g))
        d = int(torch.randint(s + r, context + 2 - r, (), generator=g))
        chunks[row, d:d + r] = chunks[row, s:s + r].clone()
    return chunks[:, :-1], chunks[:, 1:]


WARMUP = 100  # steps of linear warm-up; train() uses it as it is


def lr_at(step: int, steps: int, lr: float, warmup: int = WARMUP, floor: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine from lr down to ``floor * lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    done = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done)))


def train(model: WordLM, ids: torch.Tensor, steps: int, *, seed: int, batch_size: int = 16, lr: float = 3e-3,
          repeat: float = 0.0, lr_floor: float = 0.1, max_seconds: float = math.inf, stop_after: int | None = None,
          log_every: int = 100, on_log=None):
    """Train ``model`` in place on the token ids ``ids`` (1-D int64) for ``steps`` steps; returns the log.

    The log is a list of ``(step, loss, seconds)``: the mean training loss of the ``log_every`` steps before
    ``step``. The learning rate warms up over 100 steps, then follows a cosine down to ``lr_floor * lr``.
    ``on_log(step, loss, seconds)`` is called at each entry (and may save a checkpoint). Training stops
    early, after a logged step, once ``max_seconds`` have passed (a wall-clock cap), or after step ``stop_after``
    (which repeats a capped run exactly: the schedule still runs over ``steps``). The batches come from a
    generator seeded with ``seed``, as is the model's dropout-free initialisation by the caller.
    """
    g = torch.Generator().manual_seed(seed)
    context = model.config["context"]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    log, total, t0 = [], 0.0, time.perf_counter()
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, floor=lr_floor)
        x, y = batch(ids, batch_size, context, g, repeat)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        total += loss.item()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            seconds = time.perf_counter() - t0
            log.append((step + 1, total / ((step % log_every) + 1), seconds))
            total = 0.0
            if on_log is not None:
                on_log(*log[-1])
            if seconds > max_seconds or (stop_after is not None and step + 1 >= stop_after):
                break
    model.eval()
    return log
