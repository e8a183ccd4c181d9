"""python -m mha: the walk-through, headless."""

import re
import subprocess
import sys

import pytest

from mha.__main__ import main


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


@pytest.mark.parametrize(
    "args, option",
    [
        (["--d-model", "30", "--heads", "4"], "--d-model 30 is not divisible by --heads 4"),
        (["--heads", "0"], "--heads"),
        (["--heads", "-3"], "--heads"),
        (["--d-model", "0"], "--d-model"),
        (["--batch", "0"], "--batch"),
        (["--tokens", "-1"], "--tokens"),
        (["--seed", "99999999999999999999"], "--seed"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_errors_name_the_command_line_option(args, option, capsys):
    """The user typed --heads, not h: the message says what to change on the command line."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert option in err, err
    assert not re.search(r"\b(h|d_model|batch|tokens|seed)(=| must)", err), err


def test_seed_range_is_what_torch_accepts(capsys):
    top = 2**64 - 1
    with pytest.raises(SystemExit):
        main(["--seed", str(top + 1)])
    assert f"from 0 to {top}" in capsys.readouterr().err
    assert main(["--seed", str(top)]) == 0  # the largest seed torch.manual_seed takes
    assert "module == step by step" in capsys.readouterr().out
