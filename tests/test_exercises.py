"""mha.exercises: the checkers pass right code written several ways, and name every mistake in the bug zoo.

The zoo (tests/bug_zoo.py, tests/bug_zoo_layers.py) holds what a hunt for ways to break the checkers found:
code that is right only at a notebook's own sizes, layout or dtype, and right layouts that differ from ours.
"""

import math
import re
import string

import pytest
import torch
import torch.nn.functional as F
from bug_zoo import ZOO
from torch import nn

import mha
from mha import exercises
from mha.exercises import (
    MISTAKES,
    CheckResult,
    check_attention,
    check_induction_score,
    check_merge_heads,
    check_multi_head_attention,
    check_split_heads,
    check_torch_attn_mask,
)
from mha.exercises.mistakes import EXPLAIN

CHECKERS = [check_split_heads, check_merge_heads, check_attention, check_multi_head_attention, check_torch_attn_mask,
            check_induction_score]


# --- right answers, written in different styles ----------------------------------------------------


class ArticleMultiHeadAttention(nn.Module):
    """The article's layer: one qkv matrix, view + transpose into heads, attention, transpose + reshape, W_O."""

    def __init__(self, d_model, h):
        super().__init__()
        assert d_model % h == 0
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d_k)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool)) if causal else None
        y, w = part5_attention(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, D)
        return self.out(y), w


def library_attention(q, k, v, mask=None):
    """mha's function, called the way the checker calls it."""
    return mha.scaled_dot_product_attention(q, k, v, mask)


def part5_attention(q, k, v, mask=None):
    """Part 5's scaled dot-product attention, with a keep-mask."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def einsum_attention(q, k, v, mask=None):
    scores = torch.einsum("...td,...sd->...ts", q, k) * q.size(-1) ** -0.5
    if mask is not None:
        scores = torch.where(mask.bool(), scores, torch.tensor(-1e9))  # a large negative, not -inf
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...ts,...sd->...td", weights, v), weights


def fused_with_separate_weights(q, k, v, mask=None):
    """PyTorch's fused kernel for out; the weights from a log-mask in q's dtype, added to the scores."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.mT / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + mask.to(q.dtype).log()  # log 1 = 0, log 0 = -inf
    return out, scores.softmax(-1)


def float32_scale_attention(q, k, v, mask=None):
    """The scale as a float32 tensor, whatever q's dtype: right to float32 precision on the float64 probe."""
    scores = q @ k.transpose(-2, -1) / torch.sqrt(torch.tensor(q.size(-1)))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def flattened_batch_attention(q, k, v, mask=None):
    """bmm over every leading dim flattened into one: works for any number of them."""
    lead, (T, d_k), S = q.shape[:-2], q.shape[-2:], k.size(-2)
    q3, k3, v3 = q.reshape(-1, T, d_k), k.reshape(-1, S, d_k), v.reshape(-1, S, v.size(-1))
    scores = torch.bmm(q3, k3.transpose(1, 2)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return torch.bmm(weights, v3).reshape(*lead, T, -1), weights.reshape(*lead, T, S)


class LoopOverHeads(nn.Module):
    """Each head in turn, with its rows of W_Q, W_K, W_V, concatenated with torch.cat: no reshapes at all."""

    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # no biases: the checker must cope
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, causal=True):
        T, D = x.size(1), x.size(2)
        q, k, v = self.qkv(x).split(D, dim=-1)
        heads, weights = [], []
        for i in range(self.h):
            cols = slice(i * self.d_k, (i + 1) * self.d_k)
            mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else None
            out, w = part5_attention(q[..., cols], k[..., cols], v[..., cols], mask)
            heads.append(out)
            weights.append(w)
        return self.out(torch.cat(heads, dim=-1)), torch.stack(weights, dim=1)


class PermuteAndFusedKernel(nn.Module):
    """permute instead of transpose, unflatten instead of view, PyTorch's fused kernel for the output."""

    def __init__(self, d_model, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, causal=True):
        qkv = self.qkv(x).unflatten(-1, (3, self.h, -1)).permute(2, 0, 3, 1, 4)  # (3, B, h, T, d_k)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        scores = q @ k.mT / math.sqrt(q.size(-1))
        if causal:
            scores = scores + torch.full(scores.shape[-2:], float("-inf")).triu(1)
        w = scores.softmax(-1)
        return self.out(y.permute(0, 2, 1, 3).flatten(2)), w


class Float32ScaleLayer(ArticleMultiHeadAttention):
    """The article's layer with Part 5's attention scaled by a float32 tensor, in the float64 probe too."""

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.h, self.d_k).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        y, w = float32_scale_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril() if causal else None)
        return self.out(y.transpose(1, 2).reshape(B, T, D)), w


class ChunkedQKVWithBuffer(ArticleMultiHeadAttention):
    """chunk(3) instead of split, and a causal mask buffer large enough for any probe, sliced to T."""

    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        self.register_buffer("tril", torch.ones(512, 512, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y, w = part5_attention(q, k, v, self.tril[:T, :T] if causal else None)
        return self.out(y.transpose(1, 2).flatten(2)), w


def induction_score_by_masks(w, tokens):
    """Notebook 05's exercise the vectorised way: a (B, T, T) table of same letters, strictly before, moved right."""
    T = tokens.size(1)
    earlier = (tokens[:, :, None] == tokens[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)
    after = torch.zeros_like(earlier)
    after[..., 1:] = earlier[..., :-1]
    return w[after].mean()


def induction_score_by_loops(w, tokens):
    """The same score with Python loops and a plain float."""
    total, count = 0.0, 0
    for b, row in enumerate(tokens.tolist()):
        for t, letter in enumerate(row):
            if letter in row[:t]:
                total += float(w[b, t, row.index(letter) + 1])
                count += 1
    return total / count


RIGHT = {
    check_split_heads: [
        mha.split_heads,
        lambda x, h: x.unflatten(-1, (h, -1)).permute(0, 2, 1, 3),
        lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),
        lambda x, h: x.reshape(*x.shape[:-1], h, -1).transpose(-3, -2),
        lambda x, h: torch.stack([x[..., i * (x.size(-1) // h) : (i + 1) * (x.size(-1) // h)] for i in range(h)], 1),
    ],
    check_merge_heads: [
        mha.merge_heads,
        lambda x: x.permute(0, 2, 1, 3).flatten(2),
        lambda x: torch.cat(x.unbind(1), dim=-1),
        lambda x: x.transpose(1, 2).contiguous().view(x.size(0), x.size(2), -1),
        lambda x: torch.cat([x[:, i] for i in range(x.size(1))], dim=-1),
    ],
    check_attention: [
        library_attention,
        part5_attention,
        einsum_attention,
        fused_with_separate_weights,
        float32_scale_attention,
        flattened_batch_attention,
        lambda q, k, v, mask=None: part5_attention(q, k, v, None if mask is None else mask != 0),
    ],
    check_multi_head_attention: [
        mha.MultiHeadAttention,
        ArticleMultiHeadAttention,
        LoopOverHeads,
        PermuteAndFusedKernel,
        ChunkedQKVWithBuffer,
        Float32ScaleLayer,
    ],
    check_torch_attn_mask: [
        mha.to_torch_attn_mask,
        lambda keep: ~keep,
        lambda keep: torch.zeros(keep.shape).masked_fill(~keep, float("-inf")),
        mha.to_additive_mask,
        lambda keep: torch.where(keep, 0.0, float("-inf")),
        lambda keep: keep == 0,
        lambda keep: (~keep).float() * -1e9,  # a large negative instead of -inf, and no 0 * inf
    ],
    check_induction_score: [
        induction_score_by_masks,
        induction_score_by_loops,
        lambda w, tokens: induction_score_by_masks(w, tokens).reshape(1),  # a one-element tensor is one number
    ],
}


@pytest.mark.parametrize(
    "check, fn", [(c, f) for c, fns in RIGHT.items() for f in fns],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_right_code_passes(check, fn):
    result = check(fn)
    assert result.passed, result.message
    assert bool(result) and result.mistake is None
    assert result.message.startswith("✅ passed:") and repr(result) == str(result) == result.message
    assert result.status == "passed"


# --- the bug zoo ------------------------------------------------------------------------------------


def _zoo():
    return [(name, member, word, words) for name, members in ZOO.items() for member, word, words in members]


@pytest.mark.parametrize("checker, member, word, words", _zoo(), ids=lambda v: getattr(v, "__name__", None))
def test_every_zoo_member_fails_with_its_word_and_says_why(checker, member, word, words):
    result = getattr(exercises, checker)(member)
    assert not result.passed and not result and result.status == "wrong"
    assert result.mistake == word, result.message
    assert result.message.startswith("❌ wrong:"), result.message
    assert (word is None or word in result.message) and words in result.message, result.message


def test_the_zoo_covers_every_mistake_in_the_table():
    assert {word for members in ZOO.values() for _, word, _ in members} - {None} == set(MISTAKES)


def test_every_explanation_of_the_shared_table_is_given_to_a_zoo_member():
    # Each entry's longest literal run (its text between the {fields}) must appear in some zoo member's message,
    # so no explanation is dead text and each one is pinned by a member.
    messages = "\n".join(getattr(exercises, name)(member).message for name, member, _, _ in _zoo())
    unused = [key for key, text in EXPLAIN.items()
              if max((literal for literal, *_ in string.Formatter().parse(text)), key=len) not in messages]
    assert not unused, unused


def test_unrecognised_mistakes_give_the_probe_and_the_largest_difference():
    result = check_merge_heads(lambda x: mha.merge_heads(x) + 0.5)
    assert not result and result.mistake is None
    assert "(2, 3, 5, 4)" in result.message and "largest difference is 0.5" in result.message
    result = check_split_heads(lambda x, h: x[:, None, :, : x.size(-1) // h])
    assert "shape (2, 1, 5, 4)" in result.message and "(2, 3, 5, 4)" in result.message


def test_a_difference_below_three_digits_is_shown_with_the_digits_that_differ():
    # A float64 answer off by 4e-9 once read "(yours 0.842, right 0.842)": the two numbers must read differently.
    result = check_attention(lambda q, k, v, mask=None: tuple(t + 1e-5 * (q.dtype == torch.float64)
                                                              for t in part5_attention(q, k, v, mask)))
    assert not result and "float64" in result.message and "largest difference is 1e-05" in result.message
    yours, right = re.search(r"yours (\S+), right (\S+)\)", result.message).groups()
    assert yours != right and abs(float(yours) - float(right) - 1e-5) < 1e-9, result.message


def test_k_T_fails_on_the_batched_probes_and_says_why():
    def two_d_only(q, k, v, mask=None):
        w = torch.softmax(q @ k.T / math.sqrt(q.size(-1)), dim=-1)  # k.T: right for (S, d_k) only
        return w @ v, w

    result = check_attention(two_d_only)
    assert not result and "k.transpose(-2, -1)" in result.message


@pytest.mark.parametrize("check", [check_split_heads, check_merge_heads, check_attention])
def test_the_probes_vary_what_a_notebook_keeps_fixed(check):
    # Every size, the number of dims, the memory layout and the dtype change across the probes: a record of
    # what the checker's reference receives.
    seen = []

    def record(*args, **kwargs):
        seen.append([(tuple(a.shape), a.dtype, a.is_contiguous()) for a in args if isinstance(a, torch.Tensor)])
        return RIGHT[check][0](*args, **kwargs)

    assert check(record).passed
    shapes = {s for probe in seen for s, _, _ in probe[:1]}
    dtypes = {d for probe in seen for _, d, _ in probe[:1]}
    assert len(shapes) >= 4 and torch.float64 in dtypes, seen
    if check is check_attention:
        assert {len(s) for s in shapes} == {2, 3, 4} and torch.float16 in dtypes
    else:
        assert any(not contiguous for probe in seen for _, _, contiguous in probe[:1])


def test_the_layer_checker_builds_every_head_count_and_length_it_names():
    built = []

    class Recording(mha.MultiHeadAttention):
        def __init__(self, d_model, h):
            super().__init__(d_model, h)
            built.append((d_model, h))

        def forward(self, x, causal=True):
            built.append((tuple(x.shape), x.dtype))
            return super().forward(x, causal=causal)

    result = check_multi_head_attention(Recording)
    assert result.passed, result.message
    assert {(12, 3), (10, 2), (8, 1), (16, 4), (24, 6)} <= set(built)
    assert ((1, 40, 16), torch.float32) in built and ((2, 6, 24), torch.float64) in built


# --- the contract: stubs, errors, misuse, determinism -----------------------------------------------


def _stub(*args, **kwargs):
    raise NotImplementedError


class StubModule(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, causal=True):
        raise NotImplementedError("write forward")


@pytest.mark.parametrize("check, stub", [(c, _stub) for c in CHECKERS] + [(check_multi_head_attention, StubModule)])
def test_a_stub_is_not_implemented_yet(check, stub):
    result = check(stub)
    assert isinstance(result, CheckResult) and not result.passed and result.mistake is None
    assert result.message.startswith("⏳ not done yet:") and result.status == "not done yet"
    assert "not implemented yet" in result.message


@pytest.mark.parametrize("check", CHECKERS)
def test_code_that_raises_never_makes_the_checker_raise(check):
    def broken(*args, **kwargs):
        return 1 / 0

    result = check(broken)
    assert not result and "ZeroDivisionError" in result.message and "division by zero" in result.message


@pytest.mark.parametrize("check", CHECKERS)
@pytest.mark.parametrize("not_callable", [None, torch.zeros(2), "split_heads"])
def test_a_checker_given_something_not_callable_raises_type_error(check, not_callable):
    with pytest.raises(TypeError, match="not callable"):
        check(not_callable)


def test_a_module_instance_instead_of_its_class_is_misuse():
    with pytest.raises(TypeError, match="the class, not an instance"):
        check_multi_head_attention(mha.MultiHeadAttention(12, 3))


@pytest.mark.parametrize("check", CHECKERS)
def test_checkers_are_deterministic_and_leave_the_global_rng_alone(check):
    def noisy(*args, **kwargs):  # wrong, and random: uses the global RNG
        torch.manual_seed(123)
        return torch.randn(3)

    state = torch.get_rng_state()
    first = check(noisy)
    assert torch.equal(torch.get_rng_state(), state)
    assert check(noisy).message == first.message
    right = RIGHT[check][0]
    assert check(right).message == check(right).message
    assert torch.equal(torch.get_rng_state(), state)


def test_exercises_is_part_of_the_package():
    assert mha.exercises is exercises
    assert set(exercises.__all__) >= {f.__name__ for f in CHECKERS}
