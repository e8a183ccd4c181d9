"""One sentence for notebook 02's picture of a trained layer: which patterns notebook 06 finds for each head, and
the first sentence of the held-out text that shows every one of them.

The rule lives here, tested, so that the lesson shows the picture and not the search for it.
"""

from __future__ import annotations

from . import measure
from .data import Labelled


def found_patterns(scores: dict, layer: int, h: int) -> dict[int, list[str]]:
    """For each head of ``layer``, the patterns that notebook 06's bar finds for it, in :data:`measure.PATTERNS` order.

    Args:
        scores: one seed's scores on one book, ``english.shipped_scores()["seeds"][str(seed)]["score"]``.
        layer: the layer, counted from 0.
        h: the layer's number of heads.

    Returns:
        ``{head: [pattern, ...]}``: every pattern (the control pattern left out) whose verdict
        (:func:`measure.verdict`) is *found*, i.e. that passes the bar against the same-distance baseline and, where
        the pattern has one, the same-class control.
    """
    named = [name for name in scores if measure.PATTERNS[name][0] != "control"]
    return {head: [name for name in named
                   if measure.verdict(measure.Score.from_dict(scores[name]), name, (layer, head))["found"]]
            for head in range(h)}


def cells(labels: dict, pattern: str, window: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The (query, key) cells of ``pattern`` inside words ``lo`` to ``hi - 1`` of ``window``, counted from ``lo``.

    ``labels`` is :func:`measure.pairs` of the text; a pattern it has no labels for (copying) has no cells.
    """
    return [(q - lo, k - lo) for w, q, k in labels.get(pattern, []) if w == window and lo <= k < q < hi]


def sentence(text: Labelled, labels: dict, patterns, windows: int, context: int = 128,
             words: tuple[int, int] = (10, 16)) -> tuple[int, int, int]:
    """The first sentence of the first ``windows`` windows that lies within one window and holds a cell of each pattern.

    A sentence ends at ".", "?" or "!". Patterns without labels (copying) are not asked for.

    Returns:
        ``(window, lo, hi)``: the sentence is words ``lo`` to ``hi - 1`` of that window of ``context`` words.

    Raises:
        ValueError: no sentence of ``words[0]`` to ``words[1]`` words holds them all (names the patterns).
    """
    asked = [p for p in patterns if p in labels]
    ends = [i for i, word in enumerate(text.words[: windows * context]) if word in {".", "?", "!"}]
    for a, b in zip([0] + [e + 1 for e in ends], [e + 1 for e in ends]):
        n, lo = divmod(a, context)
        if words[0] <= b - a <= words[1] and n == (b - 1) // context and all(
                cells(labels, p, n, lo, lo + b - a) for p in asked):
            return n, lo, lo + b - a
    raise ValueError(f"no sentence of {words[0]} to {words[1]} words in the first {windows} windows holds all of "
                     f"{asked}: pass more windows or other words=(least, most)")
