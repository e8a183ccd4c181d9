"""Notebook 03's language, model and training, as a module the sweep (heads_sweep.py) can run many times.

This is the code of notebook 03's sections 1 to 3, with the settings the notebook fixes made arguments (the
mask, the learning rate, the number of steps, when to measure). With the notebook's settings it trains the very
same models: same sentences in the same order, same initial weights, same updates. The notebook trains a few of
them live; tests/test_heads_claims.py checks that they are the ones this module's sweep shipped
(mha/data/heads_sweep.json).

The language: a sentence is ``(adjective) subject verb object object ... pronoun``; at the pronoun a model must
name three words: the one just before it ("nearby"), the one object of the pronoun's kind ("refers to") and the
first noun ("subject"). The model: token + position embeddings, one ``mha.MultiHeadAttention(32, h)``, and one
linear readout per relation at the pronoun; no residual connection, no MLP.
"""

from __future__ import annotations

import copy
import random

import torch
import torch.nn.functional as F
from torch import nn

import mha

NOUNS = {  # 24 nouns per pronoun
    "he": "king prince man boy father son brother uncle nephew husband monk duke "
          "lord emperor wizard groom lad baron sultan bull stallion rooster ram grandpa".split(),
    "she": "queen princess woman girl mother daughter sister aunt niece wife nun duchess "
           "lady empress witch bride lass baroness sultana cow mare hen ewe grandma".split(),
    "it": "stone table river cart apple door bell rope boat cup drum lamp "
          "book coin key box ring sword wheel tower bridge basket ladder kettle".split(),
}
PRONOUNS = list(NOUNS)
ADJECTIVES = ["old", "young", "tall", "small"]
VERBS = ["saw", "met", "found", "followed"]
VOCAB = ["<pad>"] + PRONOUNS + ADJECTIVES + VERBS + [w for p in PRONOUNS for w in NOUNS[p]]
INDEX = {w: i for i, w in enumerate(VOCAB)}
RELATIONS = ["nearby", "refers to", "subject"]
T_MAX = 8
BATCH = 128
TRAIN_SEED, TEST_SEED, VALIDATION_SEED = 100, 200, 300  # the sentence generators' seeds

# Keep-masks (True = may attend). The notebook's: each word sees only the words before it, not itself.
LOOK_BACK = torch.ones(T_MAX, T_MAX, dtype=torch.bool).tril(diagonal=-1)
CAUSAL = torch.ones(T_MAX, T_MAX, dtype=torch.bool).tril()  # the control: itself too
MASKS = {"look back": LOOK_BACK, "causal": CAUSAL}


def make_sentence(rng: random.Random):
    """One sentence (a list of words) and the positions of its (nearby, refers to, subject) words."""
    pronoun = rng.choice(PRONOUNS)
    others = [p for p in PRONOUNS if p != pronoun]
    words = [rng.choice(ADJECTIVES)] if rng.random() < 0.5 else []
    subject = len(words)
    words.append(rng.choice(NOUNS["he"] + NOUNS["she"]))  # a person
    words.append(rng.choice(VERBS))
    n_objects = rng.randint(2, 4)
    referent = len(words) + rng.randrange(n_objects - 1)  # any object but the last
    for i in range(len(words), len(words) + n_objects):
        words.append(rng.choice(NOUNS[pronoun if i == referent else rng.choice(others)]))
    words.append(pronoun)
    return words, (len(words) - 2, referent, subject)


def make_data(n: int, seed: int):
    """n sentences as tensors: tokens (n, T_MAX), query (n,), where (n, 3), targets (n, 3)."""
    rng = random.Random(seed)
    sentences = [make_sentence(rng) for _ in range(n)]
    tokens = torch.zeros(n, T_MAX, dtype=torch.long)  # 0 = <pad>
    for row, (words, _) in enumerate(sentences):
        tokens[row, : len(words)] = torch.tensor([INDEX[w] for w in words])
    query = torch.tensor([len(words) - 1 for words, _ in sentences])
    where = torch.tensor([positions for _, positions in sentences])
    return tokens, query, where, tokens.gather(1, where)


def fewer_nouns(data, n_nouns: int):
    """The same sentences, with noun i of each list replaced by noun i mod n_nouns of the same list."""
    swap = torch.arange(len(VOCAB))
    for nouns in NOUNS.values():
        for i, noun in enumerate(nouns):
            swap[INDEX[noun]] = INDEX[nouns[i % n_nouns]]
    tokens, query, where, targets = data
    return swap[tokens], query, where, swap[targets]


def one_relation(data, r: int):
    """The same sentences, with all three readouts asked for relation r's word (the one-job control)."""
    tokens, query, where, targets = data
    return tokens, query, where, targets[:, [r, r, r]]


class OneLayer(nn.Module):
    """Embeddings, one attention layer with h heads under ``mask``, and one linear readout per relation."""

    def __init__(self, h: int, d_model: int = 32, mask: torch.Tensor = LOOK_BACK):
        super().__init__()
        self.tok = nn.Embedding(len(VOCAB), d_model)
        self.pos = nn.Embedding(T_MAX, d_model)
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.1)
        self.attn = mha.MultiHeadAttention(d_model, h)
        self.readout = nn.ModuleList(nn.Linear(d_model, len(VOCAB)) for _ in RELATIONS)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens, query, need_weights=False):
        """tokens (B, T), query (B,) -> logits (B, 3, vocab), and the pronoun's weights (B, h, T) or None."""
        B, T = tokens.shape
        x = self.tok(tokens) + self.pos(torch.arange(T))
        y, w = self.attn(x, mask=self.mask[:T, :T], need_weights=need_weights)
        rows = torch.arange(B)
        logits = torch.stack([readout(y[rows, query]) for readout in self.readout], dim=1)
        return logits, None if w is None else w[rows, :, query]


def accuracy(model, data) -> torch.Tensor:
    """(3,): the fraction of sentences whose (nearby, refers to, subject) word the model names."""
    tokens, query, _, targets = data
    with torch.no_grad():
        logits, _ = model(tokens, query)
    return (logits.argmax(-1) == targets).float().mean(0)


def train(h, seed, data, test, *, steps, lr=1e-2, mask=LOOK_BACK, measure_at=(), keep_at=()):
    """A OneLayer with h heads, trained for ``steps`` Adam steps of BATCH sentences, each sentence used once.

    Returns the model, {step: test accuracy (3,)} at every step in ``measure_at``, and {step: a copy of the
    model} at every step in ``keep_at``. Neither touches the random state, so neither changes the training:
    the first 300 steps of a 3,000-step run are the 300-step run.
    """
    torch.manual_seed(seed)
    model = OneLayer(h, mask=mask)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    tokens, query, _, targets = data
    if len(tokens) < steps * BATCH:
        raise ValueError(f"{steps} steps of {BATCH} need {steps * BATCH} sentences, got {len(tokens)}")
    curve, kept = {}, {}
    for step in range(steps):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        logits, _ = model(tokens[rows], query[rows])
        loss = F.cross_entropy(logits.flatten(0, 1), targets[rows].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 in measure_at:
            curve[step + 1] = accuracy(model, test)
        if step + 1 in keep_at:
            kept[step + 1] = copy.deepcopy(model)
    return model, curve, kept


def relation_weights(model, data) -> torch.Tensor:
    """(h, 3): the pronoun's mean weight, per head, on each relation's word."""
    tokens, query, where, _ = data
    with torch.no_grad():
        _, w = model(tokens, query, need_weights=True)  # (N, h, T)
    return w.gather(-1, where[:, None, :].expand(-1, w.size(1), -1)).mean(0)


def without_heads(model, heads):
    """A copy of model whose W_O ignores ``heads``: the columns that read their d_k outputs are zero."""
    pruned = copy.deepcopy(model)
    d_k = pruned.attn.d_k
    with torch.no_grad():
        for head in heads:
            pruned.attn.out.weight[:, head * d_k : (head + 1) * d_k] = 0.0
    return pruned
