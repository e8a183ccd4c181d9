"""Notebook 06's text: a cleaned text derived from the World English Bible (public domain), shipped gzipped.

``mha/data/english/SOURCE.md`` states the source, the licence and the cleaning; ``experiments/english_data.py``
made the files. Tokens are the words and punctuation marks of spaCy's English tokenizer, already separated by
single spaces in the files, so reading them needs neither spaCy nor a download: ``str.split()`` gives them back.
The model sees them lower-cased, as word ids: the ``vocab_size - 1`` most frequent training words and ``<unk>``.
"""

from __future__ import annotations

import collections
import gzip
from dataclasses import dataclass
from importlib import resources

import torch

UNK = "<unk>"
CHOOSE_BOOK, SCORE_BOOK = "I Samuel", "II Samuel"  # held-out parts: choose a head on one, score it on the other


def _open(name: str):
    return gzip.open(resources.files("mha.data").joinpath("english").joinpath(name).open("rb"), "rt", encoding="utf-8")


def train_words() -> list[str]:
    """Every training token, lower-cased, in order (1,337,765 of them: every book but 1 and 2 Samuel)."""
    with _open("train.txt.gz") as f:
        return [w for line in f for w in line.rstrip("\n").split("\t", 1)[1].lower().split(" ")]


def vocabulary(words: list[str], size: int) -> list[str]:
    """``<unk>`` and the ``size - 1`` most frequent words, ties broken alphabetically (so it is the same anywhere)."""
    counts = collections.Counter(words)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return [UNK] + ranked[: size - 1]


def encode(words: list[str], itos: list[str]) -> torch.Tensor:
    """Word ids (int64), lower-casing each word; words outside the vocabulary become ``<unk>`` (id 0).

    Raises:
        TypeError: ``words`` is one string (it would be encoded letter by letter) or holds something else than
            strings (names the first). ValueError: ``itos[0]`` is not ``<unk>``, so id 0 would be a real word.
    """
    if isinstance(words, str):
        raise TypeError(f"words must be a list of words, got one string {words[:30]!r}: use text.split()")
    bad = next(((i, w) for i, w in enumerate(words) if not isinstance(w, str)), None)
    if bad is not None:
        raise TypeError(f"words[{bad[0]}] must be a string, got {type(bad[1]).__name__} {bad[1]!r}")
    if not len(itos) or itos[0] != UNK:
        raise ValueError(f"itos[0] must be {UNK!r}, the id of every word outside the vocabulary, got "
                         f"{itos[0] if len(itos) else None!r}: make itos with vocabulary(words, size)")
    stoi = {w: i for i, w in enumerate(itos)}
    return torch.tensor([stoi.get(w.lower(), 0) for w in words], dtype=torch.long)


@dataclass(frozen=True)
class Labelled:
    """Held-out tokens with a parser's labels (spaCy 3.8.16, en_core_web_sm 3.8.0): one entry per token.

    ``head[i]`` is the index of token i's syntactic head (a root is its own head), ``dep[i]`` the label of the arc
    from that head to i; ``pos`` the Universal POS tag, ``tag`` the Penn tag; ``chapter`` "II Samuel 3" and so on.
    """

    chapter: list[str]
    words: list[str]
    pos: list[str]
    tag: list[str]
    dep: list[str]
    head: list[int]

    def __len__(self) -> int:
        return len(self.words)

    def part(self, book: str) -> Labelled:
        """The tokens of one book (heads renumbered within it; an arc leaving the book becomes a root)."""
        keep = [i for i, c in enumerate(self.chapter) if c.rsplit(" ", 1)[0] == book]
        if not keep:
            raise ValueError(f"no held-out book {book!r}; the books are {CHOOSE_BOOK!r} and {SCORE_BOOK!r}")
        first = keep[0]
        n = len(keep)
        head = [self.head[i] - first if 0 <= self.head[i] - first < n else i - first for i in keep]
        pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
        return Labelled(pick(self.chapter), pick(self.words), pick(self.pos), pick(self.tag), pick(self.dep), head)


def heldout() -> Labelled:
    """1 and 2 Samuel (51,230 tokens), held out from training, with POS tags and dependency arcs."""
    with _open("heldout.tsv.gz") as f:
        next(f)  # the header
        cols = list(zip(*(line.rstrip("\n").split("\t") for line in f)))
    return Labelled(list(cols[0]), list(cols[1]), list(cols[2]), list(cols[3]), list(cols[4]),
                    [int(h) for h in cols[5]])
