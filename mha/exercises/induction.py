"""Checker for notebook 05's induction score, found from the letters alone (no repeat length L)."""

from __future__ import annotations

import math
import numbers

import torch

from ._core import Mistake, call, checker, distinct
from .mistakes import say

# How close a right score lands: the weights are float32 or float64, and the score is a mean of a few dozen of them.
TOL = 1e-5
# The mistakes the checker explains (keys of mistakes.EXPLAIN), as induction_reference's knobs.
_MISTAKES = {
    "score on the occurrence": {"shift": 0},
    "score counts itself": {"strictly_before": False},
    "score mean of means": {"pooled": False},
    "score every query": {"every_query": True},
}


def induction_reference(w, tokens, *, shift=1, strictly_before=True, pooled=True, every_query=False) -> float:
    """The score in float64, by a loop over (sequence, query, key), with knobs that reproduce known mistakes.

    For every query t and every earlier position p < t with the same letter, the weight on key p + shift; the
    mean over all of them (``pooled``), or over each sequence's and then over the sequences. With
    ``strictly_before=False`` a query also matches its own position; with ``every_query`` the sum is divided by
    the number of all queries, matched or not.
    """
    w, rows = w.double(), tokens.tolist()
    found, per_sequence = [], []
    for b, row in enumerate(rows):
        T = len(row)
        mine = [w[b, t, p + shift].item() for t in range(T) for p in range(t if strictly_before else t + 1)
                if row[p] == row[t] and p + shift < T]
        found += mine
        per_sequence.append(sum(mine) / len(mine) if mine else float("nan"))
    if every_query:
        return sum(found) / (len(rows) * len(rows[0]))
    return sum(found) / len(found) if pooled else sum(per_sequence) / len(per_sequence)


def _weights(B, T, g, dtype):
    """Random causal attention weights (B, T, T): each row a softmax over keys 0..t."""
    scores = torch.randn(B, T, T, generator=g, dtype=torch.float64) * 2
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1).to(dtype)


def _probes():
    """(weights, tokens, words for the message)."""
    g = torch.Generator().manual_seed(0)
    # Notebook 05's kind of sequence: different letters, then the last L repeated; L differs from row to row.
    rows = []
    for L in (3, 5, 4, 6):
        fresh = torch.randperm(26, generator=g)[: 14 - L]
        rows.append(torch.cat([fresh, fresh[-L:]]))
    tokens = torch.stack(rows)  # (4, 14)
    yield _weights(4, 14, g, torch.float32), tokens, "for w (4, 14, 14) and tokens (4, 14) ending in repeats of 3 to 6"
    # Letters that occur twice anywhere, not as a repeated stretch (one twice in a row), and a row with no repeat.
    tokens = torch.tensor([[0, 1, 2, 1, 3, 4, 0, 5, 6],
                           [7, 8, 9, 10, 11, 12, 13, 14, 15],
                           [3, 4, 4, 5, 6, 3, 7, 8, 5]])  # fmt: skip
    yield _weights(3, 9, g, torch.float64), tokens, ("for w (3, 9, 9) in torch.float64 and tokens (3, 9) whose "
                                                     "repeated letters are scattered, one row without any")


def _as_score(value, probe):
    """The learner's score as a Python float, or a Mistake saying what it was instead."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise Mistake(say("score not one number", got=f"a tensor of shape {tuple(value.shape)}"), probe=probe)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Mistake(say("score not one number", got=f"a {type(value).__name__}"), probe=probe)
    if math.isnan(value):
        raise Mistake(say("score nan"), probe=probe)
    return float(value)


@checker("induction_score", "fn(w, tokens)")
def check_induction_score(fn) -> str:
    """Check ``fn(w, tokens) -> float``: the mean weight on the key after each query's letter's earlier occurrence.

    ``w`` is one head's weights (B, T, T), rows that are queries and sum to 1
    over the keys 0..t (causal); ``tokens`` (B, T) the letters. For every query
    t whose letter occurred earlier, at a position p < t, the score takes the
    weight on key p + 1 (the letter that came after it), and returns the mean
    over all such (sequence, query) pairs, as one number: a Python number or a
    one-element tensor. No probe has a letter three times.

    Probes: float32 weights on 4 sequences like notebook 05's (different
    letters, then a repeat of the last L, L from 3 to 6), and float64 weights
    on 3 sequences whose repeated letters are scattered (one right after
    itself, one row with none). Explains the weight on the earlier occurrence
    itself instead of the key after it, a query counted as its own earlier
    occurrence, a mean per sequence averaged over sequences, a mean over every
    query instead of the matched ones, NaN, and a result that is not one number.

    Returns:
        A :class:`CheckResult`; a stub that raises NotImplementedError gives
        ``passed=False`` and "not done yet".

    Raises:
        TypeError: ``fn`` is not callable. The learner's code never makes it raise.
    """
    for w, tokens, probe in _probes():
        score = _as_score(call(fn, w.clone(), tokens.clone(), what="your induction_score", probe=probe), probe)
        if abs(score - induction_reference(w, tokens)) <= TOL:
            continue
        for key, knobs in _MISTAKES.items():
            if abs(score - induction_reference(w, tokens, **knobs)) <= TOL:
                raise Mistake(say(key), probe=probe)
        yours, right = distinct(score, induction_reference(w, tokens))
        raise Mistake(say("score wrong", yours=yours, right=right), probe=probe)
    return ("it gives the mean weight on the key after each earlier occurrence on sequences like notebook 05's "
            "and on sequences with scattered repeats, in float32 and float64.")
