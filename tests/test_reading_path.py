"""The layer reads in one sitting: its everyday calls run through little code in few rooms (issues 18 and 23).

A learner following ``m(x)``, ``m(x, mask=padding)`` and ``m(x, need_weights=False)`` with a debugger reads
every function of ``mha`` that those calls run, checks included, and changes file each time a call lands in
another one. This test traces the three calls as ../shared/tools/reading_path.py does: it counts the code lines
of every function they run (docstrings, comments and blank lines left out) and the moves between files in each
call's order of calls. The goal of issue 23: at most 160 code lines on the whole path, and at most 4 moves
between files in any one call (244 lines and 15 moves with a checks package apart from the code it guards).
Checks sit beside what they guard: on the path, only an entry point, a ``_check`` function of its module or the
shared ``mha/values.py`` raises; the maths they call raises nothing.
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
MAX_LINES, MAX_MOVES = 160, 4


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


def calls_of(call):
    """The code objects of mha's functions that ``call`` runs, in the order they are called (repeats kept)."""
    order = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PKG):
            order.append(frame.f_code)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return order


def moves(order):
    """How many times the path lands in another file than the call before it."""
    return sum(a.co_filename != b.co_filename for a, b in zip(order, order[1:]))


def everyday_calls():
    m = mha.MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    padding = mha.padding_mask([6, 4])[:, None, None, :]
    return {
        "m(x)": calls_of(lambda: m(x)),
        "m(x, mask=padding)": calls_of(lambda: m(x, mask=padding, causal=False)),
        "m(x, need_weights=False)": calls_of(lambda: m(x, need_weights=False)),
    }


def test_the_whole_path_is_at_most_160_code_lines_checks_included():
    codes = {(c.co_filename, c.co_firstlineno): c for order in everyday_calls().values() for c in order}
    lines = {(c.co_filename, n) for c in codes.values() for n in code_lines(c)}
    per_file = {}
    for path, _ in lines:
        per_file[os.path.relpath(path, PKG)] = per_file.get(os.path.relpath(path, PKG), 0) + 1
    print(f"whole path: {len(lines)} code lines: {per_file}")
    assert 60 < len(lines) <= MAX_LINES, per_file  # more than 60: the count is of the real path


def test_each_call_moves_between_files_at_most_4_times():
    counted = {name: moves(order) for name, order in everyday_calls().items()}
    print(counted)
    assert max(counted.values()) <= MAX_MOVES, counted
    assert counted["m(x, mask=padding)"] > 0  # the path does reach other files: the count is real


def test_on_the_path_only_entry_points_and_their_checks_raise():
    codes = {(c.co_filename, c.co_firstlineno): c for order in everyday_calls().values() for c in order}
    raisers = {f"{os.path.relpath(c.co_filename, PKG)}:{c.co_name}" for c in codes.values() if raises(c)}
    checks = {r for r in raisers if r.startswith("values.py:") or r.split(":")[1].startswith("_check")}
    entry_points = {r for r in raisers if not r.split(":")[1].startswith("_")}
    assert raisers == checks | entry_points, raisers - checks - entry_points
    assert "multihead.py:_check_inputs" in raisers and "values.py:fits" in entry_points
    maths = {f"{os.path.relpath(c.co_filename, PKG)}:{c.co_name}" for c in codes.values()} - raisers
    assert {"attention.py:attend", "attention.py:_explicit", "attention.py:_fused"} <= maths


def test_the_measurement_counts_code_finds_raises_and_moves():
    # Guards the counter itself: a docstring, comments and blank lines are not code; a raise is found; a move is a
    # call that lands in another file than the call before it.
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
    here, there = sample.__code__, mha.causal_mask.__code__
    assert moves([here, here, there, there, here]) == 2 and moves([here]) == 0
