"""mha.exercises: each checker passes right code written several ways, names every mistake of the bug zoo (learners'
wrong code, in tests/bug_zoo*.py), keeps its contract (stubs, errors, misuse, determinism), and check_answer and
check_head judge numbers and (layer, head) answers without giving the right one away."""

import math
import re
from fractions import Fraction

import bug_zoo_layers as layers
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bug_zoo import ZOO, score_right
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import nn

import mha
from mha import exercises
from mha.english.measure import Score
from mha.exercises import (
    CheckResult,
    check_answer,
    check_attention,
    check_head,
    check_induction_score,
    check_merge_heads,
    check_multi_head_attention,
    check_split_heads,
    check_torch_attn_mask,
)

CHECKERS = [check_split_heads, check_merge_heads, check_attention, check_multi_head_attention, check_torch_attn_mask,
            check_induction_score]


# --- right answers, written in different styles -----------------------------------------------------------------


def part5_attention(q, k, v, mask=None):
    """Part 5's scaled dot-product attention, with a keep-mask."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def einsum_attention(q, k, v, mask=None):
    """einsum, and a large negative instead of -inf; the scale as a float32 tensor (right to float32 precision on
    the float64 probe too)."""
    scores = torch.einsum("...td,...sd->...ts", q, k) / torch.sqrt(torch.tensor(q.size(-1)))
    if mask is not None:
        scores = torch.where(mask.bool(), scores, torch.tensor(-1e9))
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...ts,...sd->...td", weights, v), weights


def fused_with_separate_weights(q, k, v, mask=None):
    """PyTorch's fused kernel for out; the weights from a log-mask in q's dtype, added to the scores."""
    scores = q @ k.mT / math.sqrt(q.size(-1)) + (0 if mask is None else mask.to(q.dtype).log())  # log 0 = -inf
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), scores.softmax(-1)


class LoopOverHeads(nn.Module):
    """Each head in turn, with its rows of W_Q, W_K, W_V, concatenated with torch.cat: no reshapes, no biases."""

    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, causal=True):
        T, D = x.size(1), x.size(2)
        q, k, v = self.qkv(x).split(D, dim=-1)
        mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else None
        heads = [part5_attention(*(t[..., i * self.d_k : (i + 1) * self.d_k] for t in (q, k, v)), mask)
                 for i in range(self.h)]
        return self.out(torch.cat([o for o, _ in heads], dim=-1)), torch.stack([w for _, w in heads], dim=1)


class PermutedWithABuffer(layers.Article):
    """unflatten and permute instead of split, view and transpose, and a causal mask buffer (large enough for any
    probe) sliced to T."""

    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        self.register_buffer("tril", torch.ones(512, 512, dtype=torch.bool).tril(), persistent=False)

    def heads(self, x):
        return self.qkv(x).unflatten(-1, (3, self.h, -1)).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, h, T, d_k)

    def mask(self, scores, causal):
        T = scores.size(-1)
        return scores.masked_fill(~self.tril[:T, :T], float("-inf")) if causal else scores


def induction_score_by_loops(w, tokens):
    """Notebook 05's score with Python loops and a plain float."""
    total, count = 0.0, 0
    for b, row in enumerate(tokens.tolist()):
        for t, letter in enumerate(row):
            if letter in row[:t]:
                total, count = total + float(w[b, t, row.index(letter) + 1]), count + 1
    return total / count


RIGHT = {
    check_split_heads: [
        mha.split_heads,
        lambda x, h: x.unflatten(-1, (h, -1)).permute(0, 2, 1, 3),
        lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),
        lambda x, h: x.reshape(*x.shape[:-1], h, -1).transpose(-3, -2),
    ],
    check_merge_heads: [
        mha.merge_heads,
        lambda x: x.permute(0, 2, 1, 3).flatten(2),
        lambda x: torch.cat(x.unbind(1), dim=-1),
        lambda x: x.transpose(1, 2).contiguous().view(x.size(0), x.size(2), -1),
    ],
    check_attention: [
        mha.scaled_dot_product_attention, part5_attention,
        einsum_attention, fused_with_separate_weights,
        lambda q, k, v, mask=None: part5_attention(q, k, v, None if mask is None else mask != 0),
    ],
    check_multi_head_attention: [mha.MultiHeadAttention, layers.Article, LoopOverHeads, PermutedWithABuffer],
    check_torch_attn_mask: [
        mha.to_torch_attn_mask, mha.to_additive_mask, lambda keep: ~keep, lambda keep: keep == 0,
        lambda keep: torch.where(keep, 0.0, float("-inf")),
        lambda keep: (~keep).float() * -1e9,  # a large negative instead of -inf, and no 0 * inf
    ],
    check_induction_score: [
        score_right, induction_score_by_loops,
        lambda w, tokens: score_right(w, tokens).reshape(1),  # a one-element tensor is one number
    ],
}


@pytest.mark.parametrize("check, fn", [(c, f) for c, fns in RIGHT.items() for f in fns],
                         ids=lambda v: getattr(v, "__name__", None))
def test_right_code_passes(check, fn):
    result = check(fn)
    assert result.passed and bool(result) and result.mistake is None and result.status == "passed", result.message
    assert result.message.startswith("✅ passed:") and repr(result) == str(result) == result.message


# --- the bug zoo: learners' wrong code -------------------------------------------------------------------------


@pytest.mark.parametrize("checker, member, word, words",
                         [(name, *member) for name, members in ZOO.items() for member in members],
                         ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", None))
def test_every_zoo_member_fails_with_its_word_and_says_why(checker, member, word, words):
    result = getattr(exercises, checker)(member)
    assert not result.passed and not result and result.status == "wrong"
    assert result.mistake == word and result.message.startswith("❌ wrong:"), result.message
    assert (word is None or word in result.message) and words in result.message, result.message


def test_unrecognised_mistakes_give_the_probe_and_the_largest_difference_in_digits_that_differ():
    result = check_merge_heads(lambda x: mha.merge_heads(x) + 0.5)
    assert not result and result.mistake is None
    assert "(2, 3, 5, 4)" in result.message and "largest difference is 0.5" in result.message
    result = check_split_heads(lambda x, h: x[:, None, :, : x.size(-1) // h])
    assert "shape (2, 1, 5, 4)" in result.message and "(2, 3, 5, 4)" in result.message
    # A float64 answer off by 4e-9 once read "(yours 0.842, right 0.842)": the two numbers must read differently.
    result = check_attention(lambda q, k, v, mask=None: tuple(t + 1e-5 * (q.dtype == torch.float64)
                                                              for t in part5_attention(q, k, v, mask)))
    assert not result and "float64" in result.message and "largest difference is 1e-05" in result.message
    yours, right = re.search(r"yours (\S+), right (\S+)\)", result.message).groups()
    assert yours != right and abs(float(yours) - float(right) - 1e-5) < 1e-9, result.message
    result = check_attention(two_d_only)
    assert not result and "k.transpose(-2, -1)" in result.message


def two_d_only(q, k, v, mask=None):
    w = torch.softmax(q @ k.T / math.sqrt(q.size(-1)), dim=-1)  # k.T: right for (S, d_k) only
    return w @ v, w


# --- the contract: stubs, errors, misuse, determinism ------------------------------------------------------------


class StubModule(layers.Article):
    def forward(self, x, causal=True):
        raise NotImplementedError("write forward")


def _stub(*args, **kwargs):
    raise NotImplementedError


def _noisy(*args, **kwargs):  # wrong, and random: uses the global RNG
    torch.manual_seed(123)
    return torch.randn(3)


@pytest.mark.parametrize("check", CHECKERS)
def test_stubs_are_not_done_yet_errors_never_raise_misuse_does_and_the_global_rng_is_left_alone(check):
    state = torch.get_rng_state()
    for stub in (_stub, StubModule) if check is check_multi_head_attention else (_stub,):
        result = check(stub)
        assert isinstance(result, CheckResult) and not result.passed and result.mistake is None
        assert result.message.startswith("⏳ not done yet:") and result.status == "not done yet"
        assert "not implemented yet" in result.message
    result = check(lambda *args, **kwargs: 1 / 0)
    assert not result and "ZeroDivisionError" in result.message and "division by zero" in result.message
    for not_callable in (None, torch.zeros(2), "split_heads"):
        with pytest.raises(TypeError, match="not callable"):
            check(not_callable)
    if check is check_multi_head_attention:
        with pytest.raises(TypeError, match="the class, not an instance"):
            check(mha.MultiHeadAttention(12, 3, device="meta"))  # meta: building it draws no random numbers
    assert check(_noisy).message == check(_noisy).message  # deterministic, even for code that draws numbers
    assert check(RIGHT[check][0]).message == check(RIGHT[check][0]).message
    assert torch.equal(torch.get_rng_state(), state)


def _elsewhere(kind):
    """Right code whose tensors come back on the meta device or sparse, or that meets torch's NotImplementedError."""
    def wrap(check):
        right = RIGHT[check][0]
        if kind == "torch's NotImplementedError":
            return lambda *args, **kwargs: torch.ones(2).to_sparse().view(-1)
        move = (lambda t: t.to("meta")) if kind == "meta" else (lambda t: t.to_sparse())
        return lambda *args, **kwargs: torch.utils._pytree.tree_map_only(torch.Tensor, move, right(*args, **kwargs))
    return wrap


@pytest.mark.parametrize("kind", ["meta", "sparse", "torch's NotImplementedError"])
@pytest.mark.parametrize("check", [c for c in CHECKERS if c is not check_multi_head_attention])
def test_answers_on_another_device_or_layout_are_wrong_answers_never_errors(check, kind):
    """The checkers raised RuntimeError or NotImplementedError from allclose or .item() on such answers, and called
    torch's own NotImplementedError inside the learner's code "not done yet"."""
    answer = _elsewhere(kind)(check)
    if kind != "torch's NotImplementedError" and check is check_induction_score:
        answer = lambda *args: torch.tensor(0.5, device="meta")  # noqa: E731  (its right answer is a number)
    result = check(answer)
    assert isinstance(result, CheckResult) and result.message.startswith("❌ wrong"), result.message


# --- check_answer: numbers, never the right one unasked ----------------------------------------------------------


@pytest.mark.parametrize("answer, expected, kwargs, words", [
    (None, 4096, {}, "⏳ not done yet: x is not answered yet: set `answer` and run the check again."),
    (4096, 4096, {}, "✅ passed: x is right (exactly)."),
    (0.90, 0.91, {"tol": 0.05}, "✅ passed: x is right (to within 0.05)."),
    (4224, 4096, {"hint": "Biases are not weights."}, "❌ wrong: x: yours, 4,224, is a little too high (off by less "
     "than 10%) (it must match exactly). Biases are not weights. Stuck? Add reveal=True"),
    (0.97, 0.91, {"tol": 0.05}, "close, but too high (just outside ±0.05)"),
    (1.3, 1, {}, "too high by 10% to 50%"), (2.0, 1, {}, "too high: 1.5 to 3 times the right value"),
    (5.0, 1, {}, "too high: 3 to 10 times the right value"), (1e3, 1, {}, "about 1,000 times the right value"),
    (0.7, 1, {}, "too low by 10% to 50%"), (0.4, 1, {}, "too low: between a third and a half of the right value"),
    (0.2, 1, {}, "too low: between a tenth and a third of the right value"),
    (0.01, 1, {}, "too low: about 0.01 times the right value"), (-1.0, 1, {}, "too low: it has the wrong sign"),
    (0, 1, {}, "too low"), (math.inf, 1, {}, "infinite"), (math.nan, 1, {}, "NaN"),
    (None, 4, {"reveal": True}, "The right value, as you asked (reveal=True): 4."),  # shown only when asked, ...
    (3, 4, {"reveal": True}, "The right value, as you asked (reveal=True): 4."),
    (0.95, 0.947368, {"tol": 0.05, "reveal": True}, "(reveal=True): 0.95."),  # ... to the precision of tol
    (None, 0.1234567, {"tol": 1e-4, "reveal": True}, "(reveal=True): 0.1235."),
], ids=repr)
def test_an_answer_is_told_whether_it_is_right_and_which_way_and_how_far_it_misses(answer, expected, kwargs, words):
    r = check_answer(answer, expected, name="x", **kwargs)
    assert words in r.message and bool(r) == r.message.startswith("✅"), r.message


def test_named_numbers_say_which_is_wrong_which_are_pending_and_give_their_own_hint():
    expected = {"unscaled": 0.91, "scaled": 0.11}
    assert check_answer({"unscaled": 0.9, "scaled": 0.1}, expected, name="weights", tol=0.05)
    r = check_answer({"unscaled": 0.9, "scaled": 0.5}, expected, name="weights", tol=0.05,
                     hint={"scaled": "Divide by √d_k.", "unscaled": "Recount."})
    assert not r and "scaled: yours, 0.5, is too high: 3 to 10 times the right value. Divide by √d_k." in r.message
    assert "unscaled" not in r.message and "Recount" not in r.message and "0.11" not in r.message
    assert "keys" in check_answer({"unscaled": 0.9}, expected, name="weights", tol=0.05).message
    r = check_answer({"unscaled": 0.9, "scaled": None}, expected, name="weights", tol=0.05)
    assert r.status == "not done yet" and "not answered yet: scaled" in r.message
    assert check_answer({"unscaled": 5, "scaled": None}, expected, name="weights", tol=0.05).status == "wrong"
    r = check_answer({"a": 1, "b": 2}, {"a": 1, "b": 3}, name="counts", reveal=True)
    assert not r and r.message.endswith("(reveal=True): a: 1; b: 3.") and "Stuck?" not in r.message


@pytest.mark.parametrize("answer", [
    torch.tensor(0.95), torch.tensor([0.95]), torch.tensor([[0.95]], dtype=torch.float64),
    torch.tensor(0.95, requires_grad=True) * 1, torch.tensor(0.95, dtype=torch.bfloat16),
    np.float32(0.95), np.float64(0.95), np.array(0.95), np.array([0.95]), Fraction(19, 20),
], ids=repr)
def test_C15_a_number_given_as_a_tensor_numpy_scalar_or_0d_array_is_accepted(answer):
    """Case C15: check_answer(torch.tensor(0.95), 0.95) said "yours tensor(0.9500), right 0.95" and failed."""
    r = check_answer({"unscaled": answer, "scaled": torch.tensor(0.25)}, {"unscaled": 0.95, "scaled": 0.25},
                     name="the average largest weight", tol=0.05)
    assert r.passed, r.message
    assert check_answer(answer, 0.95, name="x", tol=0.05) and check_answer(0.95, answer, name="x", tol=0.05)
    assert check_answer(torch.tensor(4096), 4096, name="w") and check_answer(np.int64(4096), torch.tensor(4096),
                                                                             name="w")
    assert not check_answer(torch.tensor(4097), 4096, name="w")  # integer tensors count exactly


@pytest.mark.parametrize("answer, words", [
    (torch.tensor([0.9, 0.1]), ".item() turns a one-element tensor into a Python number"),
    (np.array([0.9, 0.1]), ".item() turns a one-element NumPy array into a Python number"),
    (torch.tensor(1.0, device="meta"), "cannot be read"), (torch.tensor(True), "not a real number"),
    (torch.tensor(1 + 2j), "not a real number"), ("0.95", "without quotes"), ([0.95], "not a list of them"),
    (True, "a bool, not a number"), (1 + 2j, "not a real number"), (object(), "pass a Python int or float"),
], ids=repr)
def test_C15_anything_else_that_is_not_a_number_says_what_to_pass(answer, words):
    """Case C15's kind: what is not one real number is told what to pass instead."""
    r = check_answer(answer, 0.95, name="x", tol=0.05)
    assert not r and r.message.startswith("❌ wrong:") and words in r.message, r.message


ODD_ANSWERS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5), st.complex_numbers(),
    st.lists(st.floats(), max_size=3), st.fractions(), st.decimals(),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.floats(), st.integers())),
    st.lists(st.floats(-1e6, 1e6), min_size=0, max_size=3).map(torch.tensor), st.integers(-(10**400), 10**400),
)


@pytest.mark.slow
@given(answer=ODD_ANSWERS, scalar=st.booleans(), reveal=st.booleans())
def test_a_learners_answer_never_makes_it_raise(answer, scalar, reveal):
    r = check_answer(answer, 4096 if scalar else {"a": 1.5, "b": -2}, name="x", tol=0.01, reveal=reveal)
    assert r.message.startswith(("✅ passed:", "❌ wrong:", "⏳ not done yet:")), r.message


@given(expected=st.one_of(st.integers(-(10**9), 10**9), st.floats(-1e9, 1e9, allow_nan=False)),
       factor=st.floats(-20, 20, allow_nan=False), tol=st.sampled_from([0.0, 0.01, 0.05]))
def test_a_wrong_answer_never_shows_the_right_value(expected, factor, tol):
    from mha.exercises.answers import _fmt

    answer = expected * factor if factor else expected + 7
    assume(abs(answer - expected) > tol and abs(expected) > 1e-6)
    r = check_answer(answer, expected, name="x", tol=tol, hint="Recompute it.")
    shown = r.message.replace(f"yours, {_fmt(answer)},", "")  # the learner's own number may be shown
    numbers = [float(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", shown)]
    bands = {0.01, 0.05, 1.5, 3, 10, 50, 0, 1, 2}  # the fixed words of the bands and the tolerance
    leaks = [n for n in numbers if math.isclose(n, expected, rel_tol=1e-3) and n not in bands
             and not math.isclose(n, 10 ** round(math.log10(abs(n) or 1)))]
    assert not r and not leaks, r.message


def test_a_bad_tol_or_an_expected_value_that_is_not_a_number_is_the_notebooks_misuse():
    for kwargs, error in (({"tol": -1}, ValueError), ({"tol": "0.1"}, TypeError)):
        with pytest.raises(error):
            check_answer(1, 1, name="x", **kwargs)
    for expected in ("1", torch.tensor([1, 2])):
        with pytest.raises(TypeError):
            check_answer(1, expected, name="x")


# --- check_head: notebook 06's (layer, head) answer ---------------------------------------------------------------


P, Q = "noun -> its determiner", "object -> its verb"


def head_scores():
    """Two layers of three heads. On P the best head above its baseline is (1, 0), the brightest (0, 0)."""
    base = torch.full((2, 3), 0.05, dtype=torch.float64)
    p = Score(torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.07, 0.12]]).double(),
              torch.tensor([[0.45, 0.05, 0.05], [0.05, 0.05, 0.05]]).double(), 0.04, 100)
    q = Score(torch.tensor([[0.1, 0.1, 0.9], [0.1, 0.1, 0.1]]).double(), base, 0.04, 100)
    return {P: p, Q: q}


@pytest.mark.parametrize("answer, word, words", [
    ((1, 0), "passed", "0.25 more"), ([1, 0], "passed", "0.25 more"), ((torch.tensor(1), np.int64(0)), "passed", ""),
    (None, "not done yet", "not answered yet"),
    ("1, 0", "not a head", "a pair (layer, head) of two ints"), ((1.0, 0), "not a head", "(1.0, 0)"),
    ((True, 0), "not a head", "counted from 0"), ((1, 0, 0), "not a head", "tuple (1, 0, 0)"),
    ((2, 1), "counted from 1", "you seem to count from 1"), ((0, 1), "swapped", "(head, layer)"),
    ((5, 0), "no such head", "layers 0 to 1 and heads 0 to 2"), ((-1, 2), "no such head", "(-1, 2) is not one"),
    ((0, 0), "raw weight", "(0.50), but it puts almost as much on any key at that distance (0.45)"),
    ((0, 2), "another pattern", f"another pattern, {Q!r}"), ((1, 2), "short", "about 4 times yours"),
    ((1, 1), "short", "more than 10 times yours"),
], ids=repr)
def test_C32_the_right_head_passes_in_any_integer_form_and_each_wrong_one_is_named_and_the_right_one_kept_back(
        answer, word, words):
    """Case C32's kind for a (layer, head) answer: one outside the model names the layers and heads it has."""
    result = check_head(answer, head_scores(), P)
    assert result.status == ("wrong" if word not in ("passed", "not done yet") else word), result.message
    assert result.mistake == (word if result.status == "wrong" else None) and words in result.message, result.message
    if not result.passed:
        assert "(1, 0)" not in result.message and "layer 1, head 0" not in result.message, result.message
        revealed = check_head(answer, head_scores(), P, reveal=True)
        assert "layer 1, head 0" in revealed.message and not revealed.passed
    with pytest.raises(KeyError, match="no pattern 'r'"):  # the notebook's misuse
        check_head(answer, head_scores(), "r")
