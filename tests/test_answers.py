"""check_answer: numeric exercises (predict, count) against an independently computed value."""

import math

import pytest

from mha.exercises import check_answer


def test_not_answered_yet():
    r = check_answer(None, 4096, name="the weights")
    assert not r and r.message.startswith("⏳") and "not answered yet" in r.message


def test_exact_integer():
    assert check_answer(4096, 4096, name="the weights")
    r = check_answer(4224, 4096, name="the weights", hint="Biases are not weights.")
    assert not r and "yours 4,224, right 4,096" in r.message and r.message.endswith("Biases are not weights.")


def test_tolerance():
    assert check_answer(0.90, 0.91, name="the largest weight", tol=0.05)
    assert not check_answer(0.80, 0.91, name="the largest weight", tol=0.05)


def test_named_numbers():
    expected = {"unscaled": 0.91, "scaled": 0.11}
    assert check_answer({"unscaled": 0.9, "scaled": 0.1}, expected, name="weights", tol=0.05)
    r = check_answer({"unscaled": 0.9, "scaled": 0.5}, expected, name="weights", tol=0.05)
    assert not r and "scaled: yours 0.5, right 0.11" in r.message and "unscaled" not in r.message
    r = check_answer({"unscaled": 0.9}, expected, name="weights", tol=0.05)
    assert not r and "keys" in r.message


@pytest.mark.parametrize("bad", ["4096", [4096], True, math.nan, {"a": 1}])
def test_a_learners_odd_answer_never_raises(bad):
    r = check_answer(bad, 4096, name="the weights")
    assert not r and r.message.startswith("❌")


@pytest.mark.parametrize("kwargs, err", [({"tol": -1}, ValueError), ({"tol": "0.1"}, TypeError)])
def test_misuse_raises(kwargs, err):
    with pytest.raises(err):
        check_answer(1, 1, name="x", **kwargs)
    with pytest.raises(TypeError):
        check_answer(1, "1", name="x")
