"""check_answer: numeric exercises (predict, count) against an independently computed value.

A wrong answer is told its direction and rough size, never the right value, unless the learner asks
(reveal=True). A number in any form a notebook computes it (a 0-d tensor, a NumPy scalar) counts as that
number (case C15).
"""

import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from mha.exercises import check_answer


def test_an_unanswered_question_says_not_done_yet_and_hides_the_answer():
    r = check_answer(None, 4096, name="the weights")
    assert not r and r.message.startswith("⏳ not done yet:") and "not answered yet" in r.message
    assert r.status == "not done yet" and "4,096" not in r.message


def test_an_integer_must_be_exact_and_a_wrong_one_is_told_which_way_without_the_answer():
    r = check_answer(4096, 4096, name="the weights")
    assert r and r.message == "✅ passed: the weights is right (exactly)." and r.status == "passed"
    r = check_answer(4224, 4096, name="the weights", hint="Biases are not weights.")
    assert not r and r.message.startswith("❌ wrong: the weights: yours, 4,224, is a little too high")
    assert "Biases are not weights." in r.message and "4,096" not in r.message and "reveal=True" in r.message


def test_a_float_passes_within_tol_and_a_near_miss_is_told_it_is_close():
    assert check_answer(0.90, 0.91, name="the largest weight", tol=0.05)
    r = check_answer(0.80, 0.91, name="the largest weight", tol=0.05)
    assert not r and "too low by 10% to 50%" in r.message and "0.91" not in r.message
    r = check_answer(0.97, 0.91, name="the largest weight", tol=0.05)
    assert not r and "close, but too high (just outside ±0.05)" in r.message


def test_named_numbers_say_which_number_is_wrong_and_which_way():
    expected = {"unscaled": 0.91, "scaled": 0.11}
    assert check_answer({"unscaled": 0.9, "scaled": 0.1}, expected, name="weights", tol=0.05)
    r = check_answer({"unscaled": 0.9, "scaled": 0.5}, expected, name="weights", tol=0.05)
    assert not r and "scaled: yours, 0.5, is too high: 3 to 10 times the right value" in r.message
    assert "unscaled" not in r.message and "0.11" not in r.message
    r = check_answer({"unscaled": 0.9}, expected, name="weights", tol=0.05)
    assert not r and "keys" in r.message


@pytest.mark.parametrize(
    "answer, words",
    [
        (1.05, "a little too high (off by less than 10%)"),
        (1.3, "too high by 10% to 50%"),
        (2.0, "too high: 1.5 to 3 times the right value"),
        (5.0, "too high: 3 to 10 times the right value"),
        (1000.0, "too high: about 1,000 times the right value"),
        (0.7, "too low by 10% to 50%"),
        (0.4, "too low: between a third and a half of the right value"),
        (0.2, "too low: between a tenth and a third of the right value"),
        (0.01, "too low: about 0.01 times the right value"),
        (-1.0, "too low: it has the wrong sign"),
        (0, "too low"),
        (math.inf, "infinite"),
        (math.nan, "NaN"),
    ],
)
def test_a_wrong_answer_gets_its_direction_and_rough_size(answer, words):
    r = check_answer(answer, 1.0, name="x")
    assert not r and words in r.message, r.message


def test_a_per_key_hint_names_the_quantity_to_recompute():
    r = check_answer({"GQA": 10, "MHA": 16}, {"GQA": 10, "MHA": 17}, name="weights",
                     hint={"GQA": "Count W_K's rows again.", "MHA": "W_Q and W_O are d_model × d_model."})
    assert "MHA: yours, 16, is a little too low (off by less than 10%). W_Q and W_O are" in r.message
    assert "Count W_K" not in r.message


def test_reveal_shows_the_right_value_only_when_asked():
    for answer in (None, 3, 4):
        r = check_answer(answer, 4, name="the rows", reveal=True)
        assert "The right value, as you asked (reveal=True): 4." in r.message
    r = check_answer({"a": 1, "b": 2}, {"a": 1, "b": 3}, name="counts", reveal=True)
    assert not r and r.message.endswith("The right value, as you asked (reveal=True): a: 1; b: 3.")
    assert "Stuck?" not in r.message
    # to the precision the tolerance asks for, so a measured value prints the same on every machine
    r = check_answer(0.95, 0.947368, name="the weight", tol=0.05, reveal=True)
    assert r.message.endswith("(reveal=True): 0.95.")
    assert check_answer(None, 0.1234567, name="x", tol=1e-4, reveal=True).message.endswith(": 0.1235.")


def test_keys_left_as_none_are_not_done_yet():
    expected = {"a": 1, "b": 2}
    r = check_answer({"a": 1, "b": None}, expected, name="counts")
    assert not r and r.status == "not done yet" and "not answered yet: b" in r.message
    r = check_answer({"a": 5, "b": None}, expected, name="counts")
    assert r.status == "wrong" and "not answered yet: b" in r.message
    assert check_answer({"a": None, "b": None}, expected, name="counts").status == "not done yet"


# --- C15: a number is judged by its value, not by the type it came in -----------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        torch.tensor(0.95), torch.tensor([0.95]), torch.tensor([[0.95]], dtype=torch.float64),
        torch.tensor(0.95, requires_grad=True) * 1, torch.tensor(0.95, dtype=torch.bfloat16),
        np.float32(0.95), np.float64(0.95), np.array(0.95), np.array([0.95]), Fraction(19, 20),
    ],
    ids=repr,
)
def test_C15_a_number_given_as_a_tensor_numpy_scalar_or_0d_array_is_accepted(answer):
    r = check_answer({"unscaled": answer, "scaled": torch.tensor(0.25)}, {"unscaled": 0.95, "scaled": 0.25},
                     name="the average largest weight", tol=0.05)
    assert r.passed, r.message
    assert check_answer(answer, 0.95, name="x", tol=0.05)
    assert check_answer(0.95, answer, name="x", tol=0.05)  # the notebook's side may be a tensor too


def test_C15_integer_tensors_count_exactly():
    assert check_answer(torch.tensor(4096), 4096, name="the weights")
    assert check_answer(np.int64(4096), torch.tensor(4096), name="the weights")
    assert not check_answer(torch.tensor(4097), 4096, name="the weights")


@pytest.mark.parametrize(
    "answer, words",
    [
        (torch.tensor([0.9, 0.1]), ".item() turns a one-element tensor into a Python number"),
        (np.array([0.9, 0.1]), ".item() turns a one-element NumPy array into a Python number"),
        (torch.tensor(1.0, device="meta"), "cannot be read"),
        (torch.tensor(True), "not a real number"),
        (torch.tensor(1 + 2j), "not a real number"),
        ("0.95", "without quotes"),
        ([0.95], "not a list of them"),
        (True, "a bool, not a number"),
        (1 + 2j, "not a real number"),
        (object(), "pass a Python int or float"),
    ],
    ids=repr,
)
def test_C15_anything_else_that_is_not_a_number_says_what_to_pass(answer, words):
    r = check_answer(answer, 0.95, name="x", tol=0.05)
    assert not r and r.message.startswith("❌ wrong:") and words in r.message, r.message


# --- properties: it never raises on a learner's answer, and never shows the right value unasked -----------

ODD_ANSWERS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5), st.complex_numbers(),
    st.lists(st.floats(), max_size=3), st.fractions(), st.decimals(),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.floats(), st.integers())),
    st.lists(st.floats(-1e6, 1e6), min_size=0, max_size=3).map(torch.tensor),
    st.integers(-(10**400), 10**400),
)


@pytest.mark.slow
@given(answer=ODD_ANSWERS, scalar=st.booleans(), reveal=st.booleans())
def test_a_learners_answer_never_makes_it_raise(answer, scalar, reveal):
    expected = 4096 if scalar else {"a": 1.5, "b": -2}
    r = check_answer(answer, expected, name="x", tol=0.01, reveal=reveal)
    assert r.message.startswith(("✅ passed:", "❌ wrong:", "⏳ not done yet:")), r.message


def _numbers(text):
    return [float(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", text)]


@given(
    expected=st.one_of(st.integers(-(10**9), 10**9), st.floats(-1e9, 1e9, allow_nan=False)),
    factor=st.floats(-20, 20, allow_nan=False), tol=st.sampled_from([0.0, 0.01, 0.05]),
)
def test_a_wrong_answer_never_shows_the_right_value(expected, factor, tol):
    answer = expected * factor if factor else expected + 7
    assume(abs(answer - expected) > tol and abs(expected) > 1e-6)
    r = check_answer(answer, expected, name="x", tol=tol, hint="Recompute it.")
    assert not r
    shown = r.message.replace(f"yours, {_format(answer)},", "")  # the learner's own number may be shown
    close = [n for n in _numbers(shown) if math.isclose(n, expected, rel_tol=1e-3)]
    bands = {0.01, 0.05, 1.5, 3, 10, 50, 0, 1, 2}  # the fixed words of the bands and the tolerance
    assert not [n for n in close if n not in bands and not math.isclose(n, 10 ** round(math.log10(abs(n) or 1)))], (
        r.message
    )


def _format(value):
    from mha.exercises.answers import _fmt

    return _fmt(value)


@pytest.mark.parametrize("kwargs, err", [({"tol": -1}, ValueError), ({"tol": "0.1"}, TypeError)])
def test_a_bad_tol_or_an_expected_value_that_is_not_a_number_raises(kwargs, err):
    with pytest.raises(err):
        check_answer(1, 1, name="x", **kwargs)
    with pytest.raises(TypeError):
        check_answer(1, "1", name="x")
    with pytest.raises(TypeError):
        check_answer(1, torch.tensor([1, 2]), name="x")
