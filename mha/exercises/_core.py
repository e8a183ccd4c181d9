"""What every checker shares: the result, running a learner's code safely, comparing tensors.

A checker's body raises :class:`Mistake` as soon as it knows what is wrong;
:func:`checker` turns that (or a clean run) into a :class:`CheckResult`. The
learner's code only ever runs through :func:`call`, which turns anything it
raises into a Mistake, so a checker never raises because of the learner's code.

Every message starts with its status in words after the mark, "✅ passed:", "❌ wrong:" or
"⏳ not done yet:", so that it reads right where no emoji font is installed and the mark is a box.
"""

from __future__ import annotations

import functools
import linecache
import math
import warnings
from dataclasses import dataclass

import torch

from .mistakes import say

# float32 probes: a right answer lands within ~1e-6 of the float64 reference; every
# wrong answer the checkers name is off by more than 1e-2 on their probes.
ATOL = 1e-4
# Other dtypes' probes: how far a right answer may land from the float64 reference. float64 allows 1e-6, not
# float64's own rounding: a right answer may hold a constant computed in float32, such as the scale
# 1 / torch.sqrt(torch.tensor(d_k)), which is off by up to ~6e-8 relative and moves the results by ~1e-8 (values
# and weights are of order 1 here). Code that casts the result to float32 is still caught, by its dtype.
ATOL_BY_DTYPE = {torch.float64: 1e-6, torch.float32: ATOL, torch.float16: 5e-3, torch.bfloat16: 3e-2}

PASSED, WRONG, NOT_DONE = "✅ passed:", "❌ wrong:", "⏳ not done yet:"


@dataclass(frozen=True, repr=False)
class CheckResult:
    """A checker's verdict. ``bool(result)`` is ``result.passed``.

    In a notebook the result displays as its message (a plain ``__repr__``, so
    the stored output is the same text on every machine). The message starts
    with its status: "✅ passed:", "❌ wrong:" or "⏳ not done yet:".

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

    @property
    def status(self) -> str:
        """"passed", "wrong" or "not done yet": the words after the message's mark."""
        return "passed" if self.passed else "not done yet" if self.message.startswith(NOT_DONE) else "wrong"

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


class Misuse(TypeError):
    """The checker was called the wrong way (not the learner's answer being wrong): raised, never reported."""


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
                    False, f"{NOT_DONE} {task} is not implemented yet: replace `raise NotImplementedError` with "
                    "your code and run the check again.",
                )
            except Mistake as m:
                where = f", {m.probe}" if m.probe else ""
                return CheckResult(False, f"{WRONG} {task}{where}: {m.message}", m.word)
            except Misuse:
                raise
            except Exception as err:  # an answer of a kind no check foresaw made comparing it fail: still an answer
                first = (str(err).strip().splitlines() or [""])[0][:200]
                return CheckResult(False, f"{WRONG} {task}: comparing what it returned with the right answer raised "
                                          f"{type(err).__name__}: {first}. Return plain dense tensors on the CPU, as "
                                          "its inputs are.")
            return CheckResult(True, f"{PASSED} {task} is correct: {summary}")

        return check

    return decorate


def call(fn, *args, what: str, probe: str, hint: str = "", **kwargs):
    """Run the learner's ``fn(*args, **kwargs)``; anything it raises becomes a Mistake.

    ``hint`` is added to the message when it raises; it may be a function of the
    error's text, for hints that fit only some errors.

    Warnings are silenced (a notebook must not show stderr), autograd is off,
    and the global RNG is seeded inside a fork, so a learner's use of
    randomness is reproducible and the caller's RNG state is left as it was.
    """
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            return fn(*args, **kwargs)
    except NotImplementedError as err:
        if _raised_by_a_stub(err):  # the exercise's own `raise NotImplementedError`, not torch's inside it
            raise _NotImplementedYet from None
        raise Mistake(f"{what} raised NotImplementedError: {str(err).splitlines()[0][:300]}", probe=probe) from None
    except Exception as err:  # the learner's code failed: say how, never re-raise
        text = str(err).strip().splitlines()
        first = text[0][:300] if text else ""
        extra = hint(first) if callable(hint) else hint
        detail = (f": {first}" if first else "") + (f". {extra}" if extra else "")
        raise Mistake(f"{what} raised {type(err).__name__}{detail}", probe=probe) from None


def _raised_by_a_stub(err: BaseException) -> bool:
    """Whether the line that raised ``err`` is a ``raise NotImplementedError`` statement (with a message or not).

    torch raises its own NotImplementedError from C++ or from its Python code; then the innermost line is a
    call, not a ``raise`` statement. IPython registers each cell's source with ``linecache``, so this works in
    notebooks as in files.
    """
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return line.startswith("raise NotImplementedError")


def expect_tensor(value, what: str, probe: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The learner's returned value as a detached tensor, or a Mistake saying what it was.

    With ``dtype``, a floating tensor of another dtype is a Mistake too (code that
    casts to float32 is right only for float32 inputs).
    """
    if not isinstance(value, torch.Tensor):
        raise Mistake(f"{what} should be a torch.Tensor, but it is a {type(value).__name__}", probe=probe)
    if value.layout != torch.strided or value.is_nested:
        raise Mistake(f"{what} should be a dense tensor, but its layout is {value.layout}", probe=probe)
    if value.device.type != "cpu":  # the checkers' inputs are on the CPU
        raise Mistake(f"{what} should be on the CPU, as its inputs are, but it is on {value.device}", probe=probe)
    if not value.is_floating_point():
        raise Mistake(f"{what} should be a floating tensor, but its dtype is {value.dtype}", probe=probe)
    if dtype is not None and value.dtype != dtype:
        raise Mistake(say("dtype", what=what, got=value.dtype, given=dtype, hint=""), probe=probe)
    return value.detach()


def expect_pair(value, what: str, names: str, probe: str, dtype: torch.dtype | None = None):
    """Unpack a returned ``(a, b)`` pair of tensors (of ``dtype``, if it is given)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = f"a {type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise Mistake(f"{what} should return a pair {names}, but it returned {got}", probe=probe)
    first, second = names.strip("()").split(", ")
    return expect_tensor(value[0], first, probe, dtype), expect_tensor(value[1], second, probe, dtype)


def matches(actual: torch.Tensor, expected: torch.Tensor, atol: float | None = None) -> bool:
    """Same shape and the same numbers to ``atol`` (NaN matches NaN: some wrong answers have it).

    ``atol`` defaults to what a right answer computed in ``actual``'s dtype reaches.
    """
    atol = ATOL_BY_DTYPE.get(actual.dtype, ATOL) if atol is None else atol
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
    yours, right = distinct(a[where].item(), e[where].item())
    return (f"{what} is wrong: the largest difference is {gap[where].item():.2g} at index {where} "
            f"(yours {yours}, right {right})")


def distinct(a: float, b: float) -> tuple[str, str]:
    """a and b with 3 significant digits, or as many more as it takes for two different numbers to read differently."""
    for digits in range(3, 18):
        shown = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if shown[0] != shown[1] or a == b:
            return shown
    return repr(a), repr(b)


def shape(*dims: int) -> str:
    return str(tuple(dims))


