"""mha.english.example, the rule behind notebook 02's picture of a trained layer, against the verdicts that
experiments/english_measure.py stored and against the text itself."""

import pytest

from mha import english
from mha.english import example, measure

TEXT = english.heldout().part(english.SCORE_BOOK)
LABELS = measure.pairs(TEXT, 128)
SEED = english.shipped_scores()["seeds"]["0"]


def test_found_patterns_agree_with_the_verdicts_the_measurement_stored():
    """Each pattern's chosen head is found by found_patterns exactly when english_measure.py's verdict says found."""
    for name, (layer, head) in SEED["chosen"].items():
        if measure.PATTERNS[name][0] == "control":
            continue
        found = example.found_patterns(SEED["score"], layer, h=4)[head]
        assert (name in found) == SEED["verdicts"][name]["found"], name


def test_cells_of_the_previous_word_are_the_diagonal_below_the_main_one():
    n, lo, hi = 0, 10, 25
    assert example.cells(LABELS, "previous word", n, lo, hi) == [(q, q - 1) for q in range(1, hi - lo)]
    assert example.cells(LABELS, "copying (induction)", n, lo, hi) == []  # no labels: no cells


def test_the_sentence_is_the_first_whole_sentence_that_holds_every_pattern():
    patterns = ["previous word", "verb -> its auxiliary", "copying (induction)"]
    n, lo, hi = example.sentence(TEXT, LABELS, patterns, windows=8)
    a, b = n * 128 + lo, n * 128 + hi
    assert TEXT.words[b - 1] in {".", "?", "!"} and (a == 0 or TEXT.words[a - 1] in {".", "?", "!"})
    assert 10 <= b - a <= 16 and hi <= 128
    assert all(example.cells(LABELS, p, n, lo, hi) for p in patterns[:2])
    # no earlier sentence of that length has an auxiliary arc 2+ words back inside it (the parser's own labels)
    ends = [i for i in range(a) if TEXT.words[i] in {".", "?", "!"}]
    for s, e in zip([0] + [x + 1 for x in ends], [x + 1 for x in ends]):
        if 10 <= e - s <= 16 and s // 128 == (e - 1) // 128:
            assert not any(TEXT.dep[i] == "aux" and s <= TEXT.head[i] < e and 2 <= TEXT.head[i] - i
                           for i in range(s, e) if TEXT.head[i] > i), (s, e)


def test_no_such_sentence_is_refused_naming_the_patterns():
    with pytest.raises(ValueError, match=r"no sentence of 10 to 11 words in the first 1 windows .*'verb -> its "):
        example.sentence(TEXT, LABELS, ["verb -> its auxiliary", "object -> its preposition"], windows=1,
                         words=(10, 11))


def test_the_picture_adds_the_words_before_the_sentence_so_each_row_sums_to_one():
    """plot_sentence's first column is the weight on the words before the sentence: each drawn row sums to 1, and
    the orange boxes are the found patterns' cells in the sentence, shifted by that column."""
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    import torch

    n, lo, hi = example.sentence(TEXT, LABELS, ["previous word", "verb -> its auxiliary"], windows=8)
    w = torch.softmax(torch.randn(2, hi - lo, 128, generator=torch.Generator().manual_seed(0)), dim=-1)
    w = w * (torch.arange(128) < torch.arange(lo, hi)[:, None] + 1)  # causal: a word sees itself and what is before
    w = w / w.sum(-1, keepdim=True)
    found = {0: ["previous word"], 1: ["copying (induction)"]}
    fig = example.plot_sentence(w, TEXT, LABELS, found, n, lo, hi)
    first = fig.axes[0]
    drawn = torch.tensor(first.images[0].get_array().data)
    assert torch.allclose(drawn.sum(-1), torch.ones(hi - lo, dtype=drawn.dtype), atol=1e-6)
    boxes = sorted((int(p.get_y() + 0.5), int(p.get_x() + 0.5)) for p in first.patches)
    assert boxes == sorted((q, k + 1) for q, k in example.cells(LABELS, "previous word", n, lo, hi))
    assert fig.axes[1].get_title() == "head 1: copying (not here)" and not fig.axes[1].patches
    with pytest.raises(ValueError, match=r"weights must be \(h, T, context\)"):
        example.plot_sentence(w[:, :, :64], TEXT, LABELS, found, n, lo, hi)
    plt.close(fig)
