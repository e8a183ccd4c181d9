"""A checker for exercises whose answer is a number (or a few named numbers), not code.

A wrong answer gets the direction and a rough size of the miss ("too high: 1.5 to 3 times the right
value"), which key is wrong and the notebook's hint, never the right value; ``reveal=True`` asks for it.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._core import NOT_DONE, PASSED, WRONG, CheckResult

_ASK = "Stuck? Add reveal=True to this call to see the right value."


def check_answer(answer, expected, *, name: str, tol: float = 0.0, hint="", reveal: bool = False) -> CheckResult:
    """Compare a learner's numeric answer with one the notebook computed independently.

    For "predict, then measure" and "count it" exercises: the notebook computes
    ``expected`` by a route of its own (a count over a module's parameters, a
    measurement) and the learner writes ``answer`` by hand or from a formula.

    A wrong answer is told, per number, whether it is too high or too low and
    roughly by how much (within 10%, 10-50%, 1.5 to 3 times, 3 to 10 times, or
    its order of magnitude), followed by ``hint``, which says what to
    recompute. The right value is never shown unless ``reveal=True``.

    Args:
        answer: the learner's answer: a number, or a dict of numbers with the
            same keys as ``expected``. A one-element real tensor, a NumPy
            scalar or array with one element counts as its number (C15).
            None, or None for a key, means "not answered yet".
        expected: the right answer, a real number (or one-element tensor) or
            a dict of them.
        name: what is being answered, used in the message ("the GQA layer's weights").
        tol: the largest accepted absolute difference (0 means exact).
        hint: a sentence added when the answer is wrong: what to recompute.
            A dict gives one sentence per key of ``expected``.
        reveal: show the right value(s) in the message, whatever the answer.

    Returns:
        A :class:`CheckResult` whose message starts "✅ passed:", "❌ wrong:" or
        "⏳ not done yet:"; the learner's answer never makes it raise.

    Raises:
        TypeError: ``expected`` is not a real number or a dict of them, or
            ``tol`` is not a real number (misuse by the notebook, not the learner).
        ValueError: ``tol`` is negative or NaN.
    """
    if not isinstance(tol, numbers.Real) or isinstance(tol, bool):
        raise TypeError(f"tol must be a real number, got {type(tol).__name__}")
    if math.isnan(tol) or tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    wanted = expected if isinstance(expected, dict) else {None: expected}
    for key, value in wanted.items():
        number, problem = _as_number(value)
        if problem:
            raise TypeError(f"expected{'' if key is None else f'[{key!r}]'} must be a real number, got {value!r}")
        wanted[key] = number
    hints = hint if isinstance(hint, dict) else {}
    shown = f" {_reveal(wanted, tol)}" if reveal else ""

    if answer is None or (isinstance(answer, dict) and answer and all(v is None for v in answer.values())):
        return CheckResult(False, f"{NOT_DONE} {name} is not answered yet: set `answer` and run the check again."
                           + shown)
    given = answer if isinstance(expected, dict) else {None: answer}
    if not isinstance(given, dict) or set(given) != set(wanted):
        want = "a number" if None in wanted else f"a dict with the keys {sorted(wanted)}"
        got = _describe(answer) if not isinstance(given, dict) else f"a dict with the keys {sorted(given, key=str)}"
        return CheckResult(False, f"{WRONG} {name}: the answer should be {want}, but it is {got}.{shown}")
    wrong, pending = [], []
    for key, value in wanted.items():
        label = "" if key is None else f"{key}: "
        if given[key] is None:
            pending.append(str(key))
            continue
        mine, problem = _as_number(given[key])
        if problem:
            wrong.append(f"{label}{problem}")
        elif not _within(mine, value, tol):  # also catches NaN
            wrong.append(f"{label}yours, {_fmt(mine)}, is {_how_far(mine, value, tol)}"
                         + (f". {hints[key]}" if key in hints else ""))
    within = "exactly" if tol == 0 else f"to within {tol:g}"
    still = f"not answered yet: {', '.join(pending)}" if pending else ""
    if wrong:
        extra = f" {hint}" if isinstance(hint, str) and hint else ""
        parts = "; ".join(wrong + ([still] if still else []))
        return CheckResult(False, f"{WRONG} {name}: {parts} (it must match {within}).{extra}" + (shown or f" {_ASK}"))
    if pending:
        return CheckResult(False, f"{NOT_DONE} {name}: the others are right so far; {still}. Set them and run the "
                           f"check again.{shown}")
    return CheckResult(True, f"{PASSED} {name} is right ({within}).{shown}")


def _as_number(value):
    """(the number, None), or (None, what is wrong with it and what to pass instead)."""
    if isinstance(value, bool):
        return None, f"{value} is a bool, not a number"
    if isinstance(value, numbers.Real):
        return value, None
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        kind = "tensor" if isinstance(value, torch.Tensor) else "NumPy array"
        size = value.numel() if isinstance(value, torch.Tensor) else getattr(value, "size", 1)
        if size != 1:
            return None, (f"a {kind} of shape {tuple(value.shape)}, not one number: reduce it to the number asked for, "
                          f"then pass that (.item() turns a one-element {kind} into a Python number)")
        try:
            number = value.item()
        except Exception as err:  # a meta tensor has no value; anything else odd lands here too
            return None, f"a {kind} whose value cannot be read ({type(err).__name__}): pass a Python number"
        if isinstance(number, bool) or not isinstance(number, numbers.Real):
            return None, f"a {kind} holding {number!r}, not a real number"
        return number, None
    if isinstance(value, str):
        return None, f"the text {value!r}: write the number itself, without quotes"
    if isinstance(value, (list, tuple)):
        return None, f"a {type(value).__name__}: give one number, not a {type(value).__name__} of them"
    return None, f"a {type(value).__name__}, not a real number: pass a Python int or float"


def _within(mine, value, tol) -> bool:
    try:
        return abs(mine - value) <= tol
    except OverflowError:  # an int too large for a float, against a float: no float is within any tol of it
        return False


def _describe(value) -> str:
    number, problem = _as_number(value)
    return problem if problem else f"the number {_fmt(number)}"


def _how_far(mine, right, tol) -> str:
    """'too high: 1.5 to 3 times the right value', and so on: the direction and a rough size, not the value."""
    try:
        return _size_of_miss(mine, right, tol)
    except (ArithmeticError, ValueError):  # a number too large for a float: the direction is still known
        return "too high" if mine > right else "too low"


def _size_of_miss(mine, right, tol) -> str:
    if math.isnan(mine):
        return "NaN"
    if math.isinf(mine):
        return "infinite"
    direction = "too high" if mine > right else "too low"
    if right == 0 or mine == 0:
        return direction
    if (mine > 0) != (right > 0):
        return f"{direction}: it has the wrong sign"
    ratio = mine / right
    if abs(mine - right) <= 2 * tol:
        return f"close, but {direction} (just outside ±{tol:g})"
    if 0.9 < ratio < 1.1:
        return f"a little {direction} (off by less than 10%)"
    if 0.5 < ratio < 1.5:
        return f"{direction} by 10% to 50%"
    bands = ((3, "1.5 to 3 times"), (10, "3 to 10 times"))
    if ratio > 1:
        for top, words in bands:
            if ratio < top:
                return f"{direction}: {words} the right value"
        return f"{direction}: about {_power_of_ten(ratio)} times the right value"
    if ratio > 1 / 3:
        return f"{direction}: between a third and a half of the right value"
    if ratio > 1 / 10:
        return f"{direction}: between a tenth and a third of the right value"
    return f"{direction}: about {_power_of_ten(ratio)} times the right value"


def _power_of_ten(ratio: float) -> str:
    """The power of ten nearest to ratio, written out: '1,000', '0.01'."""
    n = round(math.log10(ratio))
    return f"{10**n:,}" if n >= 0 else f"{10.0**n:g}"


def _reveal(wanted: dict, tol) -> str:
    """The right values, to the precision the tolerance asks for (to within 0.05: two decimals)."""
    decimals = math.ceil(-math.log10(tol)) if 0 < tol < 1 else None

    def shown(value):
        if decimals is None or isinstance(value, numbers.Integral):
            return _fmt(value)
        return f"{float(value):.{decimals}f}"

    values = "; ".join(f"{'' if key is None else f'{key}: '}{shown(value)}" for key, value in wanted.items())
    return f"The right value, as you asked (reveal=True): {values}."


def _fmt(value) -> str:
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return repr(value)
    return f"{int(number):,}" if number.is_integer() and abs(number) < 1e15 else f"{number:.4g}"
