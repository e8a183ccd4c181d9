"""Notebook 06's tools: a small language model trained on real English, and what each of its heads does, measured.

- :mod:`.data`: the shipped text (a cleaned text derived from the World English Bible, public domain) and the
  held-out text's parser labels;
- :mod:`.model`: :class:`WordLM`, whose attention layers are :class:`mha.MultiHeadAttention`;
- :mod:`.train`: the training loop that made the shipped weights (``experiments/english_train.py`` runs it);
- :mod:`.measure`: per head and per pattern, the weight on the pattern's key against the same head's
  same-distance baseline and uniform attention.

``load(seed)`` gives a shipped model (fp16 weights, loaded with ``torch.load(weights_only=True)``),
``shipped_scores()`` the scores measured on it when it was trained (and on the seeds whose weights do not ship), and
``forming_scores()`` the scores measured at checkpoints during training. A tool: it imports the lesson core, never
the other way round.
"""

from __future__ import annotations

import functools
import json
import numbers
from importlib import resources

import torch

from . import data, measure
from .data import CHOOSE_BOOK, SCORE_BOOK, heldout, train_words
from .model import WordLM

#: The shipped models' shape: 318,272 parameters each.
CONFIG = dict(vocab_size=2500, d_model=64, h=4, layers=3, context=128, mlp=4)
#: The seeds whose weights ship (647 KB each, 590 KB in the wheel: six keep the wheel under 6 MB).
SEEDS = (0, 1, 2, 3, 4, 5)
#: The seeds whose scores ship: :data:`SEEDS`, and the seeds trained with the same script and settings whose weights
#: do not ship (``shipped_scores()["seeds"]`` holds all ten).
SCORED_SEEDS = tuple(range(10))


def _file(name: str):
    return resources.files("mha.data").joinpath("english").joinpath(name)


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """The shipped models' words: ``<unk>`` and the 2,499 most frequent training words (lower-cased)."""
    return tuple(data.vocabulary(train_words(), CONFIG["vocab_size"]))


def load(seed: int) -> WordLM:
    """The shipped model trained with ``seed`` (one of :data:`SEEDS`), in float32 and eval mode.

    Raises:
        ValueError: no weights ship for that seed (names the seeds that do).
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed not in SEEDS:  # 1.0 == True == 1
        others = ", ".join(str(s) for s in SCORED_SEEDS if s not in SEEDS)
        raise ValueError(f"weights ship for seeds {SEEDS}, not for seed {seed!r}: pass one of those (seeds {others} "
                         "have scores only, in shipped_scores()['seeds'])")
    seed = int(seed)
    with _file(f"weights_seed{seed}.pt").open("rb") as f:
        state = torch.load(f, weights_only=True)
    model = WordLM(**CONFIG)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()


def shipped_scores() -> dict:
    """The scores ``experiments/english_measure.py`` measured: on the shipped models, on the seeds whose weights
    do not ship and on the control run. ``["seeds"]`` is keyed by the seed as a string, for :data:`SCORED_SEEDS`."""
    with _file("scores.json").open("r", encoding="utf-8") as f:
        return json.load(f)


def forming_scores() -> dict:
    """The scores ``experiments/english_measure.py --forming`` measured at every checkpoint of every run, on 2 Samuel.

    ``["runs"][run]`` (a seed as a string, or ``"seed0_norepeat"``) holds ``steps``, ``losses`` (one list per loss,
    an entry per step) and ``scores[pattern][kind]`` for kind ``raw``, ``base``, ``control``: an entry per step,
    each the 12 heads' numbers, layer 0's first (``control`` None for a distance), and ``uniform``.
    """
    with _file("forming.json").open("r", encoding="utf-8") as f:
        return json.load(f)


__all__ = ["CHOOSE_BOOK", "CONFIG", "SCORED_SEEDS", "SCORE_BOOK", "SEEDS", "WordLM", "data", "forming_scores",
           "heldout", "load", "measure", "shipped_scores", "train_words", "vocabulary"]
