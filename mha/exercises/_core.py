"""What every checker shares: the result, running a learner's code safely, comparing tensors.

A checker's body raises :class:`Mistake` as soon as it knows what is wrong;
:func:`checker` turns that (or a clean run) into a :class:`CheckResult`. The
learner's code only ever runs through :func:`call`, which turns anything it
raises into a Mistake, so a checker never raises because of the learner's code.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import torch

# float32 probes: a right answer lands within ~1e-6 of the float64 reference; every
# wrong answer the checkers name is off by more than 1e-2 on their probes.
ATOL = 1e-4


@dataclass(frozen=True, repr=False)
class CheckResult:
    """A checker's verdict. ``bool(result)`` is ``result.passed``.

    In a notebook the result displays as its message (a plain ``__repr__``, so
    the stored output is the same text on every machine).

    Attributes:
        passed: True when the code gave the right answer on every probe.
        message: what was checked, or what went wrong and how to fix it.
        mistake: the recognised mistake's word (a key of
            ``mha.exercises.MISTAKES``), or None when the code passed or the
            mistake is not one the checker knows by name.
    """

    passed: bool
    message: str
    mistake: str | None = None

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return self.message

    __str__ = __repr__


class Mistake(Exception):
    """Raised inside a checker's body: the learner's code is wrong, and this says how.

    ``word`` is the recognised mistake (a key of MISTAKES), ``probe`` the
    input it showed on ("for x of shape (2, 5, 12) and h=3").
    """

    def __init__(self, message: str, word: str | None = None, *, probe: str = "") -> None:
        super().__init__(message)
        self.message, self.word, self.probe = message, word, probe


class _NotImplementedYet(Exception):
    pass


def checker(task: str, usage: str):
    """Decorate a checker body ``body(fn) -> str`` (the success summary).

    ``task`` names what the learner writes ("split_heads"); ``usage`` is how
    the checker calls it, for the TypeError on misuse.
    """

    def decorate(body):
        @functools.wraps(body)
        def check(fn) -> CheckResult:
            if not callable(fn):
                raise TypeError(
                    f"{body.__name__} needs your {task} itself, called as {usage}; "
                    f"got a {type(fn).__name__}, which is not callable"
                )
            try:
                summary = body(fn)
            except _NotImplementedYet:
                return CheckResult(
                    False, f"⏳ {task} is not implemented yet: replace `raise NotImplementedError` with your "
                    "code and run the check again.",
                )
            except Mistake as m:
                where = f", {m.probe}" if m.probe else ""
                return CheckResult(False, f"❌ {task}{where}: {m.message}", m.word)
            return CheckResult(True, f"✅ {task} is correct: {summary}")

        return check

    return decorate


def call(fn, *args, what: str, probe: str, hint: str = "", **kwargs):
    """Run the learner's ``fn(*args, **kwargs)``; anything it raises becomes a Mistake.

    ``hint`` is added to the message when it raises.

    Warnings are silenced (a notebook must not show stderr), autograd is off,
    and the global RNG is seeded inside a fork, so a learner's use of
    randomness is reproducible and the caller's RNG state is left as it was.
    """
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise _NotImplementedYet from None
    except Exception as err:  # the learner's code failed: say how, never re-raise
        text = str(err).strip().splitlines()
        detail = (f": {text[0][:300]}" if text else "") + (f". {hint}" if hint else "")
        raise Mistake(f"{what} raised {type(err).__name__}{detail}", probe=probe) from None


def expect_tensor(value, what: str, probe: str) -> torch.Tensor:
    """The learner's returned value as a detached tensor, or a Mistake saying what it was."""
    if not isinstance(value, torch.Tensor):
        raise Mistake(f"{what} should be a torch.Tensor, but it is a {type(value).__name__}", probe=probe)
    if not value.is_floating_point():
        raise Mistake(f"{what} should be a floating tensor, but its dtype is {value.dtype}", probe=probe)
    return value.detach()


def expect_pair(value, what: str, names: str, probe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack a returned ``(a, b)`` pair of tensors."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = f"a {type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise Mistake(f"{what} should return a pair {names}, but it returned {got}", probe=probe)
    first, second = names.strip("()").split(", ")
    return expect_tensor(value[0], first, probe), expect_tensor(value[1], second, probe)


def matches(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL) -> bool:
    """Same shape and the same numbers to ``atol`` (NaN matches NaN: some wrong answers have it)."""
    return actual.shape == expected.shape and torch.allclose(
        actual.double(), expected.double(), rtol=0.0, atol=atol, equal_nan=True
    )


def difference(actual: torch.Tensor, expected: torch.Tensor, what: str) -> str:
    """The first wrong shape, or where the largest difference is, in words."""
    if actual.shape != expected.shape:
        return f"{what} has shape {tuple(actual.shape)}; the right shape is {tuple(expected.shape)}"
    a, e = actual.double(), expected.double()
    nan = a.isnan() & ~e.isnan()
    if nan.any():
        where = tuple(nan.nonzero()[0].tolist())
        return f"{what} holds NaN, first at index {where}, where the right value is {e[where].item():.3g}"
    gap = (a - e).abs().nan_to_num(nan=math.inf)
    where = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return (
        f"{what} is wrong: the largest difference is {gap[where].item():.2g} at index {where} "
        f"(yours {a[where].item():.3g}, right {e[where].item():.3g})"
    )


def shape(*dims: int) -> str:
    return str(tuple(dims))


def fit_scale(weights: torch.Tensor, scores: torch.Tensor, keep: torch.Tensor | None = None) -> float | None:
    """The c with ``weights == softmax(c * scores)`` over the last dim, if there is one.

    Within a row, log w_j - log w_i = c (s_j - s_i) for every kept key, so c is
    a least-squares slope. Returns None when no single c explains the weights
    (a blocked key got weight, a kept one got none, or the rows are not a
    softmax of these scores at all).
    """
    w, s = weights.double(), scores.double()
    keep = torch.ones_like(s, dtype=torch.bool) if keep is None else keep.expand_as(s)
    if w.shape != s.shape or not torch.isfinite(w).all() or (w[keep] <= 0).any() or (w[~keep] != 0).any():
        return None
    n = keep.sum(-1, keepdim=True).clamp(min=1)
    logw = torch.where(keep, w.clamp(min=1e-300).log(), 0.0)
    a = torch.where(keep, logw - logw.sum(-1, keepdim=True) / n, 0.0)  # centred within each row
    b = torch.where(keep, s - torch.where(keep, s, 0.0).sum(-1, keepdim=True) / n, 0.0)
    if (b * b).sum() == 0:
        return None
    c = ((a * b).sum() / (b * b).sum()).item()
    rows_sum_to_one = torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-3)
    return c if rows_sum_to_one and (a - c * b).abs().max() < 1e-2 else None


def name_scale(c: float, names: dict[str, float]) -> str:
    """'0.125 (1/d_k)' when c is one of the named scales, else 'about 0.17'."""
    for name, value in names.items():
        if math.isclose(c, value, rel_tol=1e-2):
            return f"{value:.3g} ({name})"
    return f"about {c:.2g}"
