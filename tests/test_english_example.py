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
