"""The test suite's own shape: a fast tier worth running, and hypothesis profiles that govern.

The fast tier (``python -m pytest -m "not slow" tests``, CONTRIBUTING.md's edit-and-test loop) leaves out the tests
marked slow. Its speed is measured, not timed here (timed tests are not allowed); what a test can keep honest is
that the loop still runs most of the suite, so nobody marks everything slow to make it fast.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import examples
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_fast_tier_runs_at_least_300_tests_and_leaves_out_the_slow_ones():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-m", "not slow", "tests"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    fast = sum("::" in line for line in r.stdout.splitlines())
    slow = re.search(r"\((\d+) deselected\)", r.stdout)
    print(f"fast tier: {fast} tests; slow: {slow and slow[1]}")
    assert fast >= 300, f"the fast tier collects only {fast} tests (goal: at least 300)"
    assert slow and int(slow[1]) > 0, "nothing is marked slow: the fast tier is the whole suite"


@pytest.mark.parametrize("under_ci", [60, 150, 400])
def test_a_scaled_hypothesis_test_runs_its_count_under_ci_and_more_under_dev(under_ci):
    assert examples(under_ci, "ci").max_examples == under_ci
    assert examples(under_ci, "dev").max_examples >= under_ci


def test_dev_explores_at_least_as_many_examples_as_ci():
    ci, dev = settings.get_profile("ci"), settings.get_profile("dev")
    assert dev.max_examples >= ci.max_examples, (dev.max_examples, ci.max_examples)
    assert ci.derandomize and not dev.derandomize  # ci repeats exactly; dev draws new examples each run
