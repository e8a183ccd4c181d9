"""Notebook 06's exercise checker: it passes the right head, names each mistake, and keeps the answer to itself."""

import pytest
import torch

from mha.english.measure import Score
from mha.exercises import check_head
from mha.exercises.real_heads import EXPLAIN


def scores():
    """Two layers of three heads. On "p" the best head above its baseline is (1, 0), the brightest (0, 0)."""
    base = torch.full((2, 3), 0.05, dtype=torch.float64)
    p = Score(torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.07, 0.12]]).double(),
              torch.tensor([[0.45, 0.05, 0.05], [0.05, 0.05, 0.05]]).double(), 0.04, 100)
    q = Score(torch.tensor([[0.1, 0.1, 0.9], [0.1, 0.1, 0.1]]).double(), base, 0.04, 100)
    return {"p": p, "q": q}


RIGHT = (1, 0)
# answer -> the mistake it is
ZOO = [
    ("1, 0", "not a head"),
    ((1.0, 0), "not a head"),
    ((True, 0), "not a head"),
    ((1, 0, 0), "not a head"),
    ((2, 1), "counted from 1"),
    ((0, 1), "swapped"),
    ((5, 0), "no such head"),
    ((-1, 2), "no such head"),
    ((0, 0), "raw weight"),
    ((0, 2), "another pattern"),
    ((1, 2), "short"),
    ((1, 1), "short"),
]


@pytest.mark.parametrize("answer", [RIGHT, [1, 0], (torch.tensor(1).item(), 0)])
def test_the_right_head_passes(answer):
    result = check_head(answer, scores(), "p")
    assert result.passed and result.message.startswith("✅ passed:"), result.message
    assert "0.25 more" in result.message, result.message


@pytest.mark.parametrize("answer, word", ZOO, ids=[f"{a}-{w}" for a, w in ZOO])
def test_each_mistake_is_named_and_the_answer_kept_back(answer, word):
    result = check_head(answer, scores(), "p")
    assert not result.passed and result.status == "wrong" and result.mistake == word, result.message
    assert result.message.startswith("❌ wrong:"), result.message
    assert "(1, 0)" not in result.message and "layer 1, head 0" not in result.message, result.message
    revealed = check_head(answer, scores(), "p", reveal=True)
    assert "layer 1, head 0" in revealed.message and not revealed.passed


def test_the_messages_say_what_is_wrong():
    assert "0.50" in check_head((0, 0), scores(), "p").message and "0.45" in check_head((0, 0), scores(), "p").message
    assert "'q'" in check_head((0, 2), scores(), "p").message
    assert "about 4 times yours" in check_head((1, 2), scores(), "p").message  # margins 0.25 against 0.07
    assert "more than 10 times yours" in check_head((1, 1), scores(), "p").message  # 0.25 against 0.02


def test_every_explanation_is_given_to_some_answer():
    words = {check_head(answer, scores(), "p").mistake for answer, _ in ZOO}
    assert words == set(EXPLAIN)


def test_not_answered_yet_and_misuse():
    result = check_head(None, scores(), "p")
    assert not result.passed and result.status == "not done yet" and "(1, 0)" not in result.message
    assert "layer 1, head 0" in check_head(None, scores(), "p", reveal=True).message
    with pytest.raises(KeyError, match="no pattern 'r'"):
        check_head(RIGHT, scores(), "r")
