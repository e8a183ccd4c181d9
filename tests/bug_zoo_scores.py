"""The bug zoo's induction scores (notebook 05, exercise 1): the score with the mistakes learners make, one each.

``score(w, tokens)`` takes one head's weights (B, T, T) and the letters (B, T), and returns the mean weight that
queries whose letter occurred earlier, at p < t, put on key p + 1. tests/bug_zoo.py lists these in ``ZOO``.
"""

import torch


def _earlier(tokens, diagonal=-1):
    """(B, T, T): query t's letter is key p's letter, for keys p <= t + diagonal."""
    T = tokens.size(1)
    return (tokens[:, :, None] == tokens[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril(diagonal)


def _after(earlier):
    """(B, T, T): the key after each marked key."""
    after = torch.zeros_like(earlier)
    after[..., 1:] = earlier[..., :-1]
    return after


def score_on_the_occurrence(w, tokens):
    return w[_earlier(tokens)].mean()  # BUG: the weight on p, not on p + 1


def score_counts_itself(w, tokens):
    return w[_after(_earlier(tokens, diagonal=0))].mean()  # BUG: tril() keeps p = t, so every query matches itself


def score_mean_of_means(w, tokens):
    after = _after(_earlier(tokens))
    return ((w * after).sum((1, 2)) / after.sum((1, 2))).mean()  # BUG: per sequence, then over sequences


def score_over_every_query(w, tokens):
    return (w * _after(_earlier(tokens))).sum(-1).mean()  # BUG: queries without an earlier occurrence count as 0


def score_per_sequence(w, tokens):
    after = _after(_earlier(tokens))
    return (w * after).sum((1, 2)) / after.sum((1, 2))  # BUG: one score per sequence, (B,), not one number


def score_per_query_first(w, tokens):
    after = _after(_earlier(tokens))
    return ((w * after).sum(-1) / after.sum(-1)).mean()  # BUG: 0 / 0 for every query without an earlier occurrence


def score_of_the_transposed_weights(w, tokens):
    return w.mT[_after(_earlier(tokens))].mean()  # BUG (not recognised): reads w[b, p + 1, t], keys by queries
