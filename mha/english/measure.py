"""What each head of notebook 06's model does, measured: the mean weight a head puts on the key a pattern names.

For a pattern (a list of (window, query, key) pairs on labelled held-out text) and every layer and head:

- ``raw``: the mean attention weight from the query to the pattern's key;
- ``base``: the same head's mean weight on keys at the same distance back, over every query of the text (the
  same-distance baseline: a head that looks 2 words back scores well on any pattern whose key is 2 words back, so
  a pattern's head has to beat what it gives that distance anyway);
- ``uniform``: 1 / (i + 1) for a query at position i, the weight of attention spread evenly over its keys.

Grammar patterns follow the parser's dependency arcs with the earlier word as the key (the model is causal).
Reference has no labels (the parser does no coreference), so it is measured by proxies that say what they are:
a pronoun's weight on the most recent noun of the kind it could refer to. Copying (induction) is measured on text
that repeats: a window of held-out text followed by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .data import Labelled, encode

# name: (viewpoint, what it is); the order of notebook 06's picture
PATTERNS = {
    "previous word": ("nearby words", "every word -> the word just before it"),
    "two words back": ("nearby words", "every word -> the word 2 before it"),
    "noun -> its determiner": ("grammar", "det arc, the determiner 2+ words back ('the great stone')"),
    "noun -> its possessor": ("grammar", "poss arc ('his servants'), any distance"),
    "verb -> its subject": ("grammar", "nsubj arc, the subject 2+ words back"),
    "verb -> its auxiliary": ("grammar", "aux arc, 2+ words back ('will not go')"),
    "object -> its verb": ("grammar", "dobj arc, the verb 2+ words back"),
    "object -> its preposition": ("grammar", "pobj arc, the preposition 2+ words back"),
    "it/its -> last singular noun": ("reference (proxy)", "it/its -> the most recent NN, 2+ words back"),
    "he/him/his -> last name": ("reference (proxy)", "he/him/his -> the most recent proper noun, 2+ words back"),
    "they/them/their -> last plural noun": ("reference (proxy)", "-> the most recent NNS/NNPS, 2+ words back"),
    "any word -> last noun (control)": ("control", "a non-pronoun -> the most recent noun or name, 2+ back"),
    "copying (induction)": ("copying", "in a passage seen before, -> the word after this word's earlier copy"),
}
ARCS = {  # pattern: (label, the query is the arc's "head" or its "dependent", the least distance)
    "noun -> its determiner": ("det", "head", 2),
    "noun -> its possessor": ("poss", "head", 1),
    "verb -> its subject": ("nsubj", "head", 2),
    "verb -> its auxiliary": ("aux", "head", 2),
    "object -> its verb": ("dobj", "dependent", 2),
    "object -> its preposition": ("pobj", "dependent", 2),
}
PRONOUNS = {  # pattern: (pronouns, is the token a candidate antecedent)
    "it/its -> last singular noun": ({"it", "its"}, lambda tag, pos: tag == "NN"),
    "he/him/his -> last name": ({"he", "him", "his"}, lambda tag, pos: tag == "NNP"),
    "they/them/their -> last plural noun": ({"they", "them", "their"}, lambda tag, pos: tag in ("NNS", "NNPS")),
}
ALL_PRONOUNS = {"he", "him", "his", "she", "her", "hers", "it", "its", "they", "them", "their", "theirs"}


@dataclass(frozen=True)
class Score:
    """One pattern's scores: ``raw`` and ``base`` are (layers, h) tensors, ``uniform`` a number, ``n`` the pairs."""

    raw: torch.Tensor
    base: torch.Tensor
    uniform: float
    n: int

    @classmethod
    def from_dict(cls, d: dict) -> Score:
        """The Score that :meth:`as_dict` wrote (as ``shipped_scores()`` holds them), in float64."""
        t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
        return cls(t(d["raw"]), t(d["base"]), float(d["uniform"]), int(d["n"]))

    def as_dict(self, digits: int = 4) -> dict:
        r = lambda t: [[round(float(v), digits) for v in row] for row in t]  # noqa: E731
        return dict(raw=r(self.raw), base=r(self.base), uniform=round(self.uniform, digits), n=self.n)


def pairs(text: Labelled, context: int) -> dict[str, list[tuple[int, int, int]]]:
    """Every text pattern's (window, query, key) pairs, for windows of ``context`` consecutive tokens.

    Both ends of a pair lie in one window; the key comes before the query. (Copying is measured separately.)
    """
    n_win = len(text) // context
    end = n_win * context
    out = {"previous word": [(b, i, i - 1) for b in range(n_win) for i in range(1, context)],
           "two words back": [(b, i, i - 2) for b in range(n_win) for i in range(2, context)]}
    for name, (label, query_is, least) in ARCS.items():
        found = []
        for g in range(end):
            if text.dep[g] != label:
                continue
            q, k = (text.head[g], g) if query_is == "head" else (g, text.head[g])
            if q < end and k < q and q // context == k // context and q - k >= least:
                found.append((q // context, q % context, k % context))
        out[name] = found
    for name, (prons, candidate) in PRONOUNS.items():
        out[name] = _most_recent(text, context, end, lambda g, p=prons: text.words[g].lower() in p, candidate)
    out["any word -> last noun (control)"] = _most_recent(
        text, context, end, lambda g: text.words[g].lower() not in ALL_PRONOUNS,
        lambda tag, pos: pos in ("NOUN", "PROPN"))
    return out


def _most_recent(text, context, end, is_query, candidate):
    found, last = [], -1
    for g in range(end):
        if g % context == 0:
            last = -1  # a new window: nothing before it is visible
        i = g % context
        if last >= 0 and i - last >= 2 and is_query(g):
            found.append((g // context, i, last))
        if candidate(text.tag[g], text.pos[g]):
            last = i
    return found


@torch.no_grad()
def head_scores(model, text: Labelled, itos: list[str], chunk: int = 50) -> dict[str, Score]:
    """Every pattern's :class:`Score` on ``text``, cut into windows of the model's context.

    Includes "copying (induction)": each window's first half followed by itself (a passage read twice); the
    query is a word of the second copy, the key the word after its earlier copy, the baseline the same head's
    weight at that distance (T/2 - 1 back) on the plain text.
    """
    ids = windows(text, itos, model.config["context"])
    n_win, context = ids.shape
    found = pairs(text, context)
    L, H = model.config["layers"], model.config["h"]
    by_offset = torch.zeros(L, H, context, dtype=torch.float64)
    sums = {name: torch.zeros(L, H, dtype=torch.float64) for name in found}
    index = {name: torch.tensor(p, dtype=torch.long).view(-1, 3) for name, p in found.items()}
    for start in range(0, n_win, chunk):
        w = model.attention_weights(ids[start:start + chunk])  # (b, layers, h, T, T)
        summed = w.sum(0)
        for d in range(context):
            by_offset[:, :, d] += summed.diagonal(offset=-d, dim1=-2, dim2=-1).sum(-1).double()
        for name, p in index.items():
            p = p[(p[:, 0] >= start) & (p[:, 0] < start + len(w))]
            sums[name] += w[p[:, 0] - start, :, :, p[:, 1], p[:, 2]].sum(0).double()
    by_offset /= (n_win * (context - torch.arange(context))).double()  # queries at distance d: context - d each
    scores = {}
    for name, p in index.items():
        dist = p[:, 1] - p[:, 2]
        scores[name] = Score(sums[name] / len(p), by_offset[:, :, dist].mean(-1), float((1.0 / (p[:, 1] + 1)).mean()),
                             len(p))
    half = context // 2
    twice = torch.cat([ids[:, :half], ids[:, :half]], 1)  # (n, 2 * half): a passage, then the same again
    q = torch.arange(half, 2 * half - 1)  # the second copy's words (but its last) ...
    k = q - half + 1  # ... look at the word after their earlier copy
    total = torch.zeros(L, H, dtype=torch.float64)
    for start in range(0, n_win, chunk):
        total += model.attention_weights(twice[start:start + chunk])[:, :, :, q, k].sum((0, -1)).double()
    n = n_win * len(q)
    scores["copying (induction)"] = Score(total / n, by_offset[:, :, half - 1].clone(),
                                          float((1.0 / (q + 1.0)).mean()), n)
    return scores


def windows(text: Labelled, itos: list[str], context: int) -> torch.Tensor:
    """The text's word ids in consecutive windows (n, context); the last, shorter piece is left out."""
    n_win = len(text) // context
    return encode(text.words[: n_win * context], itos).view(n_win, context)


@torch.no_grad()
def losses(model, text: Labelled, itos: list[str], chunk: int = 50) -> dict[str, float]:
    """Mean next-word loss (nats) on the text, and on a half-window passage read the first and the second time.

    Copying shows as a lower loss on the second reading: the words can be read off the first.
    """
    ids = windows(text, itos, model.config["context"])
    half = ids.size(1) // 2
    twice = torch.cat([ids[:, :half], ids[:, :half]], 1)
    sums = torch.zeros(3, dtype=torch.float64)
    for start in range(0, len(ids), chunk):
        for j, x in enumerate((ids[start:start + chunk], twice[start:start + chunk])):
            lp = F.cross_entropy(model(x)[0][:, :-1].transpose(1, 2), x[:, 1:], reduction="none")  # (b, T - 1)
            if j == 0:
                sums[0] += lp.sum().double()
            else:
                sums[1] += lp[:, : half - 1].sum().double()
                sums[2] += lp[:, half:].sum().double()
    n = len(ids)
    return dict(text=float(sums[0]) / (n * (ids.size(1) - 1)), first_reading=float(sums[1]) / (n * (half - 1)),
                second_reading=float(sums[2]) / (n * (half - 1)))


#: Patterns that are a distance: their same-distance baseline is the pattern itself, so a head is chosen by its raw
#: weight (against uniform attention) instead.
DISTANCES = ("previous word", "two words back")


def best_head(score: Score, pattern: str | None = None) -> tuple[int, int]:
    """(layer, head) of the head whose raw weight most exceeds its same-distance baseline.

    For a ``pattern`` of :data:`DISTANCES`, the head with the largest raw weight (the baseline would be itself).
    """
    gap = (score.raw - (0.0 if pattern in DISTANCES else score.base)).flatten()
    i = int(gap.argmax())
    return divmod(i, score.raw.size(1))
