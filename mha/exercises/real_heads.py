"""Checker for notebook 06's exercise: find the head that does a pattern, in a model trained on real English.

The learner answers ``(layer, head)``, counted from 0; the right head is the one whose weight on the pattern's
keys most exceeds its own same-distance baseline (``mha.english.measure.best_head``) on the text the notebook
chooses heads on. A wrong answer is told what is wrong with it (counted from 1, layer and head swapped, chosen by
the raw weight, the head of another pattern, or by how much it falls short), never which head is right, unless
``reveal=True``.
"""

from __future__ import annotations

import operator

import torch

from ._core import NOT_DONE, PASSED, WRONG, CheckResult

#: What this checker says, by mistake (its own table: its answers are heads, not code or numbers).
EXPLAIN = {
    "not a head": "the answer should be a pair (layer, head) of two ints counted from 0, like (0, 2); it is {got}.",
    "no such head": "the model has layers 0 to {last_layer} and heads 0 to {last_head} in each; {answer} is not "
    "one of them.",
    "counted from 1": "you seem to count from 1. Layers and heads are counted from 0 here, as in the picture's "
    "labels (L0H0 is the first head of the first layer) and in Python's indexing.",
    "swapped": "the pair reads as (head, layer), the wrong way round: the answer is (layer, head).",
    "raw weight": "this head puts the most weight on the pattern's keys ({raw:.2f}), but it puts almost as much on "
    "any key at that distance ({base:.2f}): it looks at a distance, not at this pattern. Choose by the weight "
    "above the same head's same-distance baseline.",
    "another pattern": "this head is the one for another pattern, {other!r} ({other_raw:.2f} against its baseline "
    "{other_base:.2f}); on {pattern!r} it reaches {raw:.2f} against {base:.2f}.",
    "short": "this head puts {raw:.2f} on the pattern's keys against {base:.2f} at the same distance, {gap:+.2f}; "
    "another head's margin is {ratio}. Look again at every head, not only the brightest.",
}


def _say(key, **fields):
    return EXPLAIN[key].format(**fields)


def check_head(answer, scores, pattern: str, *, reveal: bool = False) -> CheckResult:
    """Check that ``answer`` is the (layer, head) that does ``pattern`` best, measured against its baseline.

    Args:
        answer: the learner's ``(layer, head)``: a tuple or list of two ints counted from 0; None means "not
            answered yet".
        scores: ``{pattern: Score}`` from ``mha.english.measure.head_scores``, on the text heads are chosen on.
        pattern: a key of ``scores`` ("noun -> its determiner").
        reveal: also give the right head, whatever the answer.

    Returns:
        A :class:`CheckResult` whose message starts "✅ passed:", "❌ wrong:" or "⏳ not done yet:", and whose
        ``mistake`` is the recognised mistake's key of :data:`EXPLAIN` (or None). The answer never makes it raise.

    Raises:
        KeyError: ``pattern`` is not a key of ``scores`` (the notebook's misuse, not the learner's).
    """
    from ..english.measure import best_head  # a tool's checker; the English tools load only when it is used

    if pattern not in scores:
        raise KeyError(f"no pattern {pattern!r}; the patterns are {sorted(scores)}")
    score = scores[pattern]
    layers, heads = score.raw.shape
    right = best_head(score, pattern)
    shown = f" The right head is {right}: layer {right[0]}, head {right[1]}." if reveal else ""
    name = f"the head for {pattern!r}"
    if answer is None:
        return CheckResult(False, f"{NOT_DONE} {name} is not answered yet: set `answer` and run the check again."
                           + shown)
    indices = _indices(answer)
    if indices is None:
        got = repr(answer) if not isinstance(answer, (tuple, list)) else f"{type(answer).__name__} {answer!r}"
        return _wrong(name, "not a head", shown, got=got)
    answer = indices
    if answer == right:
        gap = float(score.raw[right] - score.base[right])
        return CheckResult(True, f"{PASSED} {name} is {answer}: it puts {float(score.raw[right]):.2f} of its weight "
                           f"on the pattern's keys, {gap:.2f} more than it gives keys at the same distance, the "
                           "largest margin of any head.")
    if answer == (right[0] + 1, right[1] + 1):
        return _wrong(name, "counted from 1", shown)
    if answer == (right[1], right[0]) and right[0] != right[1]:
        return _wrong(name, "swapped", shown)
    if not (0 <= answer[0] < layers and 0 <= answer[1] < heads):
        return _wrong(name, "no such head", shown, last_layer=layers - 1, last_head=heads - 1, answer=answer)
    raw, base = float(score.raw[answer]), float(score.base[answer])
    by_raw = divmod(int(score.raw.flatten().argmax()), heads)
    if answer == by_raw:
        return _wrong(name, "raw weight", shown, raw=raw, base=base)
    for other, s in scores.items():
        if (other != pattern and best_head(s, other) == answer
                and float(s.raw[answer] - s.base[answer]) > 2 * (raw - base)):
            return _wrong(name, "another pattern", shown, other=other, other_raw=float(s.raw[answer]),
                          other_base=float(s.base[answer]), pattern=pattern, raw=raw, base=base)
    best_gap, gap = float(score.raw[right] - score.base[right]), raw - base
    if gap <= best_gap / 10:
        ratio = "more than 10 times yours"
    elif best_gap / gap >= 1.5:
        ratio = f"about {best_gap / gap:.0f} times yours"
    else:
        ratio = "larger"
    return _wrong(name, "short", shown, raw=raw, base=base, gap=gap, ratio=ratio)


def _indices(answer) -> tuple[int, int] | None:
    """A (layer, head) answer as two ints, or None. Integers of any kind count, 0-dim integer tensors and NumPy
    ints too (``torch.unravel_index`` gives a pair of tensors; case C15's kind); a bool or a float does not."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return None
    if any(isinstance(a, bool) or isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in answer):
        return None
    try:
        return operator.index(answer[0]), operator.index(answer[1])
    except TypeError:
        return None


def _wrong(name, key, shown, **fields):
    return CheckResult(False, f"{WRONG} {name}: {_say(key, **fields)}{shown}", key)
