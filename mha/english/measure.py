"""What each head of notebook 06's model does, measured: the mean weight a head puts on the key a pattern names.

For a pattern (a list of (window, query, key) pairs on labelled held-out text) and every layer and head:

- ``raw``: the mean attention weight from the query to the pattern's key;
- ``base``: the same head's mean weight on keys at the same distance back, over every query of the text (the
  same-distance baseline: a head that looks 2 words back scores well on any pattern whose key is 2 words back, so
  a pattern's head has to beat what it gives that distance anyway);
- ``control`` (the same-class control): the same head's mean weight from a word of the query's part of speech to
  a word of the key's part of speech at the same distance, over the text's pairs that are not the pattern's, so
  that "noun -> its determiner" has to beat "noun -> some other determiner as far back" (a head that looks at
  determiners, whoever's they are, passes the baseline but not this); for copying, the weight at the same
  positions when the passage follows its natural preceding text instead of itself; a distance has none;
- ``uniform``: 1 / (i + 1) for a query at position i, the weight of attention spread evenly over its keys.

Grammar patterns follow the parser's dependency arcs with the earlier word as the key (the model is causal).
Reference has no labels (the parser does no coreference), so it is measured by proxies that say what they are:
a pronoun's weight on the most recent noun of the kind it could refer to. Copying (induction) is measured on text
that repeats: half a window of held-out text followed by itself.

A head *does* a pattern by :func:`passes`, a bar fixed before any of these models was measured: its weight on the
key is at least twice the comparison and at least 0.1 above it, against the baseline (uniform attention for a
distance) and, as a second verdict, against the same-class control.
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
    "copying (induction)": ("copying", "in a passage read a second time, -> the word after this word's earlier copy"),
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
    """One pattern's scores: ``raw``, ``base`` and ``control`` are (layers, h) tensors (``control`` None for a
    distance), ``uniform`` a number, ``n`` the pairs, ``n_control`` those of them with a same-class control."""

    raw: torch.Tensor
    base: torch.Tensor
    uniform: float
    n: int
    control: torch.Tensor | None = None
    n_control: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> Score:
        """The Score that :meth:`as_dict` wrote (as ``shipped_scores()`` holds them), in float64."""
        t = lambda x: None if x is None else torch.tensor(x, dtype=torch.float64)  # noqa: E731
        return cls(t(d["raw"]), t(d["base"]), float(d["uniform"]), int(d["n"]), t(d.get("control")),
                   int(d.get("n_control", 0)))

    def as_dict(self, digits: int = 4) -> dict:
        r = lambda t: None if t is None else [[round(float(v), digits) for v in row] for row in t]  # noqa: E731
        return dict(raw=r(self.raw), base=r(self.base), control=r(self.control), uniform=round(self.uniform, digits),
                    n=self.n, n_control=self.n_control)


def pairs(text: Labelled, context: int) -> dict[str, list[tuple[int, int, int]]]:
    """Every text pattern's (window, query, key) pairs, for windows of ``context`` consecutive tokens.

    Both ends of a pair lie in one window; the key comes before the query. (Copying is measured separately.)

    Raises:
        TypeError, ValueError: ``context`` is not an int from 2 to ``len(text)`` (names it).
    """
    _check_size("context", context, 2, len(text), f"the text's {len(text)} tokens")
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
def head_scores(model, text: Labelled, itos: list[str], chunk: int = 25, names=None) -> dict[str, Score]:
    """Every pattern's :class:`Score` on ``text``, cut into windows of the model's context (only ``names``, if given).

    Includes "copying (induction)": the first half of each window but the first, followed by itself (a passage read
    twice); the query is a word of the second copy, the key the word after its earlier copy, the baseline the same
    head's weight at that distance (T/2 - 1 back) on the plain text, the control its weight at the same positions
    when the passage follows the half window that precedes it in the text.

    Raises:
        TypeError, ValueError: ``chunk`` is not a positive int, or the text is shorter than one window (names it).
    """
    _check_size("chunk", chunk, 1)
    ids = windows(text, itos, model.config["context"])
    n_win, context = ids.shape
    found = {k: v for k, v in pairs(text, context).items() if names is None or k in names}
    L, H = model.config["layers"], model.config["h"]
    classes = sorted(set(text.pos))
    cls = torch.tensor([classes.index(p) for p in text.pos[: n_win * context]]).view(n_win, context)
    qi, ki = torch.tril_indices(context, context, offset=-1)  # every (query, key) pair with the key before
    cells = len(classes) ** 2 * context
    cell = (cls[:, qi] * len(classes) + cls[:, ki]) * context + (qi - ki)  # (n_win, pairs): (class q, class k, d)
    cell_sum = torch.zeros(L * H, cells, dtype=torch.float64)
    by_offset = torch.zeros(L, H, context, dtype=torch.float64)
    index = {name: torch.tensor(p, dtype=torch.long).view(-1, 3) for name, p in found.items()}
    per_pair = {name: [] for name in found}
    for start in range(0, n_win, chunk):
        w = model.attention_weights(ids[start:start + chunk])  # (b, layers, h, T, T)
        summed = w.sum(0)
        for d in range(context):
            by_offset[:, :, d] += summed.diagonal(offset=-d, dim1=-2, dim2=-1).sum(-1).double()
        cell_sum.index_add_(1, cell[start:start + len(w)].flatten(),
                            w[:, :, :, qi, ki].permute(1, 2, 0, 3).reshape(L * H, -1).double())
        for name, p in index.items():
            p = p[(p[:, 0] >= start) & (p[:, 0] < start + len(w))]
            per_pair[name].append(w[p[:, 0] - start, :, :, p[:, 1], p[:, 2]].reshape(-1, L * H).double())
    by_offset /= (n_win * (context - torch.arange(context))).double()  # queries at distance d: context - d each
    cell_count = torch.bincount(cell.flatten(), minlength=cells)
    scores = {}
    for name, p in index.items():
        weight = torch.cat(per_pair[name])  # (n, L * H)
        dist = p[:, 1] - p[:, 2]
        control, covered = None, 0
        if name not in DISTANCES:  # the pattern's pairs left out of their cells: the rest of the same class
            c = (cls[p[:, 0], p[:, 1]] * len(classes) + cls[p[:, 0], p[:, 2]]) * context + dist
            own = torch.zeros(L * H, cells, dtype=torch.float64).index_add_(1, c, weight.T)
            others = cell_count[c] - torch.bincount(c, minlength=cells)[c]
            ok = others > 0
            covered = int(ok.sum())
            control = ((cell_sum[:, c] - own[:, c])[:, ok] / others[ok]).mean(1).view(L, H)
        scores[name] = Score(weight.mean(0).view(L, H), by_offset[:, :, dist].mean(-1),
                             float((1.0 / (p[:, 1] + 1)).mean()), len(p), control, covered)
    if names is None or "copying (induction)" in names:
        scores["copying (induction)"] = _copying(model, ids, by_offset, chunk)
    return scores


def _copying(model, ids, by_offset, chunk):
    twice, natural = readings(ids)
    half = ids.size(1) // 2
    q = torch.arange(half, 2 * half - 1)  # the second copy's words (but its last) ...
    k = q - half + 1  # ... look at the word after their earlier copy
    L, H = by_offset.shape[:2]
    total = torch.zeros(2, L, H, dtype=torch.float64)
    for start in range(0, len(twice), chunk):
        for j, x in enumerate((twice, natural)):
            total[j] += model.attention_weights(x[start:start + chunk])[:, :, :, q, k].sum((0, -1)).double()
    n = len(twice) * len(q)
    return Score(total[0] / n, by_offset[:, :, half - 1].clone(), float((1.0 / (q + 1.0)).mean()), n,
                 total[1] / n, n)


def readings(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each window's first half (a passage; not the first window's), as two texts of windows (n - 1, T):

    - read twice: the passage, then the same passage again;
    - after its natural context: the half window that precedes it in the text, then the passage, at the same
      positions as its second reading (the control: the same words after as many words, none of them a copy).
    """
    half = ids.size(1) // 2
    passage = ids[1:, :half]
    return torch.cat([passage, passage], 1), torch.cat([ids[:-1, half:2 * half], passage], 1)


def windows(text: Labelled, itos: list[str], context: int) -> torch.Tensor:
    """The text's word ids in consecutive windows (n, context); the last, shorter piece is left out.

    Raises:
        TypeError, ValueError: ``context`` is not an int from 2 to ``len(text)`` (names it).
    """
    _check_size("context", context, 2, len(text), f"the text's {len(text)} tokens")
    n_win = len(text) // context
    return encode(text.words[: n_win * context], itos).view(n_win, context)


@torch.no_grad()
def losses(model, text: Labelled, itos: list[str], chunk: int = 50) -> dict[str, float]:
    """Mean next-word loss (nats): on the text; and on each passage of :func:`readings` read the first time, the
    second time, and after its natural context (the same words at the same positions as the second reading).

    Copying shows as a second reading cheaper than the first. Cheaper than after natural context too, it is copying,
    not the longer context a word of the second reading has behind it. Each reading's first word is left out.

    Raises:
        TypeError, ValueError: as :func:`head_scores`.
    """
    _check_size("chunk", chunk, 1)
    ids = windows(text, itos, model.config["context"])
    half = ids.size(1) // 2
    twice, natural = readings(ids)
    sums = torch.zeros(4, dtype=torch.float64)
    for start in range(0, len(ids), chunk):
        for j, x in enumerate((ids, twice, natural)):
            x = x[start:start + chunk]
            if len(x) == 0:
                continue
            lp = F.cross_entropy(model(x)[0][:, :-1].transpose(1, 2), x[:, 1:], reduction="none")  # (b, T - 1)
            if j == 0:
                sums[0] += lp.sum().double()
            elif j == 1:
                sums[1] += lp[:, : half - 1].sum().double()
                sums[2] += lp[:, half:].sum().double()
            else:
                sums[3] += lp[:, half:].sum().double()
    n, per = len(ids), len(twice) * (half - 1)
    return dict(text=float(sums[0]) / (n * (ids.size(1) - 1)), first_reading=float(sums[1]) / per,
                second_reading=float(sums[2]) / per, natural_context=float(sums[3]) / per)


#: Patterns that are a distance: their same-distance baseline is the pattern itself, so a head is chosen by its raw
#: weight (against uniform attention) instead.
DISTANCES = ("previous word", "two words back")


def best_head(score: Score, pattern: str | None = None) -> tuple[int, int]:
    """(layer, head) of the head whose raw weight most exceeds its same-distance baseline.

    For a ``pattern`` of :data:`DISTANCES`, the head with the largest raw weight (the baseline would be itself).

    Raises:
        ValueError: ``pattern`` is neither None nor a name of :data:`PATTERNS` (a misspelt distance pattern would be
            judged against its baseline, itself).
    """
    if pattern is not None and pattern not in PATTERNS:
        raise ValueError(f"no pattern {pattern!r}; the patterns are {list(PATTERNS)}")
    gap = (score.raw - (0.0 if pattern in DISTANCES else score.base)).flatten()
    i = int(gap.argmax())
    return divmod(i, score.raw.size(1))


#: The bar, fixed before looking: a head does a pattern if its weight on the key is at least TIMES the comparison and
#: at least ABOVE more (notebook 06 used it on its 1,800-step models; it was kept for the retrained ones).
TIMES, ABOVE = 2.0, 0.1


def passes(raw: float, against: float) -> bool:
    """True if ``raw`` is at least :data:`TIMES` ``against`` and at least :data:`ABOVE` more."""
    return raw >= TIMES * against and raw - against >= ABOVE


def verdict(score: Score, pattern: str, head: tuple[int, int]) -> dict:
    """One head's numbers on one pattern and its two verdicts by :func:`passes`.

    ``raw``; ``base`` (uniform attention for a distance) and ``control`` (None for a distance); ``by_base`` and
    ``by_control`` (None without a control): the head passes against each; ``found``: it passes against both.
    """
    raw = float(score.raw[head])
    base = score.uniform if pattern in DISTANCES else float(score.base[head])
    control = None if score.control is None else float(score.control[head])
    by_base = passes(raw, base)
    by_control = None if control is None else passes(raw, control)
    return dict(raw=raw, base=base, control=control, by_base=by_base, by_control=by_control,
                found=by_base and by_control is not False)


def _check_size(name, n, low, high=None, what=""):
    """Raise unless ``n`` is an int in [low, high] (a bool is not one), naming it, the range and what bounds it."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__} {n!r}")
    if n < low or (high is not None and n > high):
        allowed = f"at least {low}" if high is None else f"from {low} to {high} ({what})"
        raise ValueError(f"{name}={n} is outside what works: it must be {allowed}")
