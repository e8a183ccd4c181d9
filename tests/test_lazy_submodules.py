"""`import mha`, then `mha.plot.head_view(...)`: the tools around the lesson load on first use (PEP 562).

The README and the docs write `mha.plot.head_view` and `mha.parallel.shard_heads` after a bare `import mha`.
Those subpackages are loaded by `mha.__getattr__` when first named, so `import mha` itself stays quick and quiet
and needs neither matplotlib nor torch.distributed. Each check runs in a fresh interpreter: in this one, another
test has long since imported them.
"""

import subprocess
import sys
import textwrap

import pytest


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_import_mha_then_the_tools_as_attributes():
    r = run_fresh("""
        import sys
        import mha
        heavy = [m for m in ("mha.plot", "mha.parallel", "mha.exercises", "matplotlib") if m in sys.modules]
        print("loaded by import mha:", heavy)
        print(mha.plot.head_view.__name__, mha.exercises.check_attention.__name__, mha.parallel.shard_heads.__name__)
        print("in dir(mha):", all(name in dir(mha) for name in ("plot", "exercises", "parallel")))
        print("importlib in dir(mha):", "importlib" in dir(mha))
        try:
            mha.plots
        except AttributeError as err:
            print("AttributeError:", err)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "loaded by import mha: []",
        "head_view check_attention shard_heads",
        "in dir(mha): True",
        "importlib in dir(mha): False",
        "AttributeError: module 'mha' has no attribute 'plots'",
    ], r.stdout
    assert r.stderr == ""


def test_without_matplotlib_import_mha_is_silent_and_mha_plot_loads():
    # sys.modules[name] = None makes `import matplotlib` fail, as on a machine with torch alone
    r = run_fresh("""
        import sys
        sys.modules["matplotlib"] = None
        import mha
        print(mha.plot.head_view.__name__, mha.plot.HeadView.__name__)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["head_view", "HeadView"] and r.stderr == ""


@pytest.mark.parametrize("name", ["plot", "exercises", "parallel"])
def test_a_lazy_submodule_is_the_module_that_import_gives(name):
    import importlib

    import mha

    assert getattr(mha, name) is importlib.import_module(f"mha.{name}")
