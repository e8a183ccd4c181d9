"""python -m mha: the walk-through, headless."""

import re
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "mha", *args], capture_output=True, text=True, timeout=120)


def test_default_walkthrough():
    r = run()
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "B=2, T=6, d_model=32, h=4, d_k=8" in out
    for shape in ["(2, 6, 96)", "(2, 4, 6, 8)", "(2, 4, 6, 6)", "(6, 6)", "(2, 6, 32)"]:
        assert shape in out
    assert "1 head:   4,096 + 128 = 4,224" in out and "4 heads:  4,096 + 128 = 4,224" in out
    assert re.search(r"module == step by step: +True", out)
    assert r.stderr == ""


def test_options():
    r = run("--d-model", "48", "--heads", "3", "--batch", "1", "--tokens", "5")
    assert r.returncode == 0 and "(1, 3, 5, 16)" in r.stdout


def test_bad_option_is_one_line_and_exit_2():
    for args in (["--d-model", "30", "--heads", "4"], ["--heads", "x"], ["--tokens", "0"]):
        r = run(*args)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and "error" in r.stderr and "Traceback" not in r.stderr
    assert "d_model=30" in run("--d-model", "30", "--heads", "4").stderr
