"""The layer reads in one sitting: its everyday calls run through little code, and none of it raises (issue 18).

A learner following ``m(x)``, ``m(x, mask=padding)`` and ``m(x, need_weights=False)`` reads every function of
``mha`` that those calls run. This test traces them and counts those functions' code lines (docstrings, comments
and blank lines left out), as ../shared/tools/reading_path.py does; files whose path contains "check" or "valid"
count apart, since input checks belong there. The goal: at most 120 code lines in at most 4 files outside the
checks module, and no function on the path that raises outside it.
"""

import ast
import inspect
import io
import os
import sys
import textwrap
import tokenize

import torch

import mha

PKG = os.path.dirname(mha.__file__)
MAX_LINES, MAX_FILES = 120, 4


def is_checks(path):
    rel = os.path.relpath(path, PKG)
    return "check" in rel or "valid" in rel


def parse(code):
    lines, start = inspect.getsourcelines(code)
    return lines, start, ast.parse(textwrap.dedent("".join(lines)))


def code_lines(code):
    """Line numbers of a function's code: its source without docstrings, comments and blank lines."""
    lines, start, tree = parse(code)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    found = set()
    for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent("".join(lines))).readline):
        if tok.type not in skip:
            found.update(start + n - 1 for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return found


def raises(code):
    return any(isinstance(node, ast.Raise) for node in ast.walk(parse(code)[2]))


def functions_run_by(call):
    """The code objects of mha's functions that ``call`` runs."""
    seen = {}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PKG):
            seen[frame.f_code.co_filename, frame.f_code.co_firstlineno] = frame.f_code

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return list(seen.values())


def reading_path():
    m = mha.MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    padding = mha.padding_mask([6, 4])[:, None, None, :]
    codes = {}
    for call in (lambda: m(x), lambda: m(x, mask=padding, causal=False), lambda: m(x, need_weights=False)):
        codes.update({(c.co_filename, c.co_firstlineno): c for c in functions_run_by(call)})
    lines = {(c.co_filename, n) for c in codes.values() if not is_checks(c.co_filename) for n in code_lines(c)}
    raisers = sorted(f"{os.path.relpath(c.co_filename, PKG)}:{c.co_name}" for c in codes.values()
                     if not is_checks(c.co_filename) and raises(c))
    return lines, raisers, codes


def test_the_everyday_calls_read_in_few_lines_and_files():
    lines, _, _ = reading_path()
    per_file = {}
    for path, _ in lines:
        per_file[os.path.relpath(path, PKG)] = per_file.get(os.path.relpath(path, PKG), 0) + 1
    assert len(lines) <= MAX_LINES and len(per_file) <= MAX_FILES, per_file


def test_nothing_on_the_reading_path_raises_outside_the_checks_module():
    _, raisers, codes = reading_path()
    assert not raisers
    # The measurement sees the checks: they run on the path, in their own module.
    assert any(is_checks(path) for path, _ in codes)


def test_the_measurement_counts_code_and_finds_raises():
    # Guards the counter itself: a docstring, comments and blank lines are not code; a raise is found.
    def sample(a):
        """Doc.

        More doc.
        """
        # a comment

        if a:  # trailing comment
            raise ValueError(
                "message"
            )
        return a

    assert len(code_lines(sample.__code__)) == 6  # def, if, raise ValueError(, "message", ), return
    assert raises(sample.__code__) and not raises(code_lines.__code__)
