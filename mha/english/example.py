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


def plot_sentence(weights, text: Labelled, labels: dict, found: dict, window: int, lo: int, hi: int,
                  context: int = 128):
    """Notebook 02's picture: each head's weights from the sentence's words, with the patterns it is found for.

    Args:
        weights: (h, T, context) tensor, one layer's attention weights from the sentence's T = ``hi - lo`` queries
            (words ``lo`` to ``hi - 1`` of ``window``) to every key of that window.
        text, labels, found, window, lo, hi: as for :func:`sentence` and :func:`found_patterns`.

    The first key column, "(earlier)", is the weight on every word before the sentence, so each row adds up to 1.
    A found pattern's cells in the sentence are outlined in orange; a found pattern with no cell here (copying,
    which needs a repeated passage) is named with "(not here)".

    Returns:
        The matplotlib Figure, a 2 × ceil(h / 2) grid of heatmaps sharing one colour bar.

    Raises:
        ValueError: ``weights`` is not (h, T, context) for the sentence's T words.
    """
    import matplotlib.pyplot as plt
    import torch
    from matplotlib.patches import Rectangle

    from ..plot.labels import AS_WRITTEN, label

    h, T = weights.shape[0], hi - lo
    if tuple(weights.shape[1:]) != (T, context):
        raise ValueError(f"weights must be (h, T, context) = (h, {T}, {context}) for words {lo} to {hi - 1}; "
                         f"got {tuple(weights.shape)}: pass the layer's weights [..., lo:hi, :] for one window")
    earlier = weights[..., :lo].sum(-1, keepdim=True)  # (h, T, 1): every word before the sentence, one column
    shown = torch.cat([earlier, weights[..., lo:hi]], dim=-1).detach().float()  # (h, T, 1 + T)
    words = [label(w) for w in text.words[window * context + lo : window * context + hi]]
    fig, axes = plt.subplots(2, (h + 1) // 2, figsize=(6.2, 7.6), sharex=True, sharey=True, constrained_layout=True)
    for head, ax in zip(range(h), axes.flat):
        image = ax.imshow(shown[head].numpy(), cmap="viridis", vmin=0, vmax=float(shown.max()))
        named = []
        for name in found[head]:
            here = cells(labels, name, window, lo, hi)
            for q, k in here:
                ax.add_patch(Rectangle((k + 1 - 0.5, q - 0.5), 1, 1, fill=False, ec="#D55E00", lw=2))
            named.append(name.replace(" -> ", " → ").replace(" (induction)", "") + ("" if here else " (not here)"))
        ax.set_title(f"head {head}: " + ("\n".join(named) or "no pattern found"), fontsize=12, **AS_WRITTEN)
        ax.set_xticks(range(T + 1), ["(earlier)", *words], rotation=90, fontsize=12, **AS_WRITTEN)
        ax.set_yticks(range(T), words, fontsize=12, **AS_WRITTEN)
        ax.set_xlabel("key" if ax.get_subplotspec().is_last_row() else "", fontsize=12)
        ax.set_ylabel("query" if ax.get_subplotspec().is_first_col() else "", fontsize=12)
    fig.colorbar(image, ax=axes, orientation="horizontal", shrink=0.7, label="weight (orange: a pattern found)")
    return fig
