"""Our tests notice the learners' mistakes: each one, applied to a copy of the library, fails its named tests.

The mutants and the full report live in tests/mutants.py (``python tests/mutants.py`` runs the
whole suite on every mutant; this file runs only the named killers, in one interpreter).
"""

import subprocess
import sys

import pytest
from mutants import MUTANTS, ROOT

from mha.exercises import MISTAKES


def test_every_mistake_of_the_table_has_a_mutant():
    assert {m.word for m in MUTANTS} == set(MISTAKES)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutant_still_applies_to_the_library(mutant):
    # A refactoring that moves the mutated line must update the mutant, not silently drop it.
    for file, old, _ in mutant.edits:
        assert (ROOT / file).read_text().count(old) == 1, (mutant.name, file, old)
    assert mutant.killers


@pytest.mark.slow
def test_every_mutant_fails_its_killers_which_pass_on_the_library():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mutants.py"), "--killers"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    report = "\n".join(line for line in result.stdout.splitlines() if "expected" in line or "wrong" in line)
    assert result.returncode == 0, report + result.stderr[-2000:]
