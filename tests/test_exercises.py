"""mha.exercises: the checkers pass right code written several ways, and name every mistake in the bug zoo."""

import math

import pytest
import torch
import torch.nn.functional as F
from bug_zoo import ZOO, torch_mask_as_float
from torch import nn

import mha
from mha import exercises
from mha.exercises import (
    MISTAKES,
    CheckResult,
    check_attention,
    check_merge_heads,
    check_multi_head_attention,
    check_split_heads,
    check_torch_attn_mask,
)

CHECKERS = [check_split_heads, check_merge_heads, check_attention, check_multi_head_attention, check_torch_attn_mask]


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
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) * q.size(-1) ** -0.5
    if mask is not None:
        scores = torch.where(mask.bool(), scores, torch.tensor(-1e9))  # a large negative, not -inf
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("bhts,bhsd->bhtd", weights, v), weights


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


RIGHT = {
    check_split_heads: [
        mha.split_heads,
        lambda x, h: x.unflatten(-1, (h, -1)).permute(0, 2, 1, 3),
        lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),
    ],
    check_merge_heads: [
        mha.merge_heads,
        lambda x: x.permute(0, 2, 1, 3).flatten(2),
        lambda x: torch.cat(x.unbind(1), dim=-1),
    ],
    check_attention: [
        library_attention,
        part5_attention,
        einsum_attention,
    ],
    check_multi_head_attention: [
        mha.MultiHeadAttention,
        ArticleMultiHeadAttention,
        LoopOverHeads,
        PermuteAndFusedKernel,
    ],
    check_torch_attn_mask: [
        mha.to_torch_attn_mask,
        lambda keep: ~keep,
        lambda keep: torch.zeros(keep.shape).masked_fill(~keep, float("-inf")),
        mha.to_additive_mask,
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
    assert result.message.startswith("✅") and repr(result) == str(result) == result.message


# --- the bug zoo ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "checker, member, word",
    [(name, member, word) for name, members in ZOO.items() for member, word in members],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_every_zoo_member_fails_with_its_word(checker, member, word):
    result = getattr(exercises, checker)(member)
    assert not result.passed and not result
    assert result.mistake == word, result.message
    assert word in result.message and result.message.startswith("❌")


def test_the_zoo_covers_every_mistake_in_the_table():
    assert {word for members in ZOO.values() for _, word in members} == set(MISTAKES)


def test_a_float_01_mask_is_recognised_as_blocking_nothing():
    result = check_torch_attn_mask(torch_mask_as_float)
    assert not result and result.mistake is None
    assert "blocks nothing" in result.message


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda q, k, v, mask=None: part5_attention(q, k, v, None), "changes nothing"),
        (lambda q, k, v, mask=None: _after_softmax(q, k, v, mask), "after the softmax"),
        (lambda q, k, v, mask=None: (part5_attention(q, k, v, mask)[0] * 2, part5_attention(q, k, v, mask)[1]),
         "largest difference"),
        (lambda q, k, v, mask=None: (part5_attention(q, k, v, mask)[0], None), "torch.Tensor"),
        (lambda q, k, v, mask=None: part5_attention(q, k, v, mask)[0], "pair (out, weights)"),
        (lambda q, k, v, mask=None: part5_attention(q, k, v, mask)[::-1], "(weights, out)"),
        (lambda q, k, v, mask=None: _two_d_only(q, k, v), "k.transpose(-2, -1)"),
    ],
)
def test_attention_mistakes_outside_the_table_are_explained(fn, words):
    result = check_attention(fn)
    assert not result and result.mistake is None
    assert words in result.message


def _two_d_only(q, k, v):
    w = torch.softmax(q @ k.T / math.sqrt(q.size(-1)), dim=-1)  # k.T: right for (S, d_k) only
    return w @ v, w


def _after_softmax(q, k, v, mask):
    w = torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        w = w * mask
    return w @ v, w


def test_unrecognised_mistakes_give_the_probe_and_the_largest_difference():
    result = check_merge_heads(lambda x: mha.merge_heads(x) + 0.5)
    assert not result and result.mistake is None
    assert "(2, 3, 5, 4)" in result.message and "largest difference is 0.5" in result.message
    result = check_split_heads(lambda x, h: x[:, None])
    assert "shape (2, 1, 5, 12)" in result.message and "(2, 3, 5, 4)" in result.message


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
    assert "not implemented yet" in result.message


@pytest.mark.parametrize("check", CHECKERS)
def test_code_that_raises_never_makes_the_checker_raise(check):
    def broken(*args, **kwargs):
        return 1 / 0

    result = check(broken)
    assert not result and "ZeroDivisionError" in result.message and "division by zero" in result.message


@pytest.mark.parametrize("check", CHECKERS)
@pytest.mark.parametrize("not_callable", [None, torch.zeros(2), "split_heads"])
def test_misuse_raises_type_error(check, not_callable):
    with pytest.raises(TypeError, match="not callable"):
        check(not_callable)


def test_a_module_instance_instead_of_its_class_is_misuse():
    with pytest.raises(TypeError, match="the class, not an instance"):
        check_multi_head_attention(mha.MultiHeadAttention(12, 3))


def test_wrong_module_layouts_are_explained():
    class NoQKV(nn.Module):
        def __init__(self, d_model, h):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))

    assert "no `qkv` layer" in check_multi_head_attention(NoQKV).message
    assert "should build an nn.Module" in check_multi_head_attention(lambda d, h: (d, h)).message

    class AveragedWeights(ArticleMultiHeadAttention):
        def forward(self, x, causal=True):
            y, w = super().forward(x, causal)
            return y, w.mean(dim=1)

    assert "not their average" in check_multi_head_attention(AveragedWeights).message

    class AlwaysCausal(ArticleMultiHeadAttention):
        def forward(self, x, causal=True):
            return super().forward(x, True)

    assert "causal=False) still applies the causal mask" in check_multi_head_attention(AlwaysCausal).message


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


def test_a_mask_changed_in_place_is_caught():
    result = check_torch_attn_mask(lambda keep: keep.logical_not_())
    assert not result and "in place" in result.message


def test_exercises_is_part_of_the_package():
    assert mha.exercises is exercises
    assert set(exercises.__all__) >= {f.__name__ for f in CHECKERS}
