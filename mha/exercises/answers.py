"""A checker for exercises whose answer is a number (or a few named numbers), not code."""

from __future__ import annotations

import math
import numbers

from ._core import CheckResult


def check_answer(answer, expected, *, name: str, tol: float = 0.0, hint: str = "") -> CheckResult:
    """Compare a learner's numeric answer with one the notebook computed independently.

    For "predict, then measure" and "count it" exercises: the notebook computes
    ``expected`` by a route of its own (a count over a module's parameters, a
    measurement) and the learner writes ``answer`` by hand or from a formula.

    Args:
        answer: the learner's answer: a number, or a dict of numbers with the
            same keys as ``expected``. None means "not answered yet".
        expected: the right answer, a real number or a dict of them.
        name: what is being answered, used in the message ("the GQA layer's weights").
        tol: the largest accepted absolute difference (0 means exact).
        hint: a sentence added to the message when the answer is wrong.

    Returns:
        A :class:`CheckResult`; the learner's answer never makes it raise.

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
        if not _is_real(value):
            raise TypeError(f"expected{'' if key is None else f'[{key!r}]'} must be a real number, got {value!r}")

    if answer is None:
        return CheckResult(False, f"⏳ {name} is not answered yet: set `answer` and run the check again.")
    given = answer if isinstance(expected, dict) else {None: answer}
    if not isinstance(given, dict) or set(given) != set(wanted):
        want = "a number" if None in wanted else f"a dict with the keys {sorted(wanted)}"
        return CheckResult(False, f"❌ {name}: the answer should be {want}, got {answer!r}")
    wrong = []
    for key, value in wanted.items():
        mine = given[key]
        label = "" if key is None else f"{key}: "
        if not _is_real(mine) or math.isnan(mine) or abs(mine - value) > tol:
            wrong.append(f"{label}yours {_fmt(mine)}, right {_fmt(value)}")
    within = "exactly" if tol == 0 else f"to within {tol:g}"
    if wrong:
        extra = f". {hint}" if hint else ""
        return CheckResult(False, f"❌ {name}: " + "; ".join(wrong) + f" (must match {within}){extra}")
    return CheckResult(True, f"✅ {name} is right ({within}).")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _fmt(value) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return f"{value:,}"
    if _is_real(value):
        return f"{value:.4g}"
    return repr(value)
