"""How mha's modules import each other: the tools load on first use, and the house's layers hold.

`import mha`, then `mha.plot.head_view(...)`: the README and the docs write `mha.plot.head_view` and
`mha.parallel.shard_heads` after a bare `import mha`. Those subpackages are loaded by `mha.__getattr__` when first
named (PEP 562), so `import mha` itself stays quick and quiet and needs neither matplotlib nor torch.distributed.
Each check runs in a fresh interpreter: in this one, another test has long since imported them.

Which module may import which (the lesson at the bottom, what sits beside it, the tools on top, and no cycles) is
import-linter's to check: the contracts are pyproject.toml's [tool.importlinter].
"""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # this checkout


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env=ENV)


@pytest.mark.slow  # a fresh interpreter imports torch: seconds
def test_import_mha_then_the_tools_as_attributes():
    r = run_fresh("""
        import sys
        import mha
        tools = ("mha.plot", "mha.parallel", "mha.exercises", "mha.english", "matplotlib")
        print("loaded by import mha:", [m for m in tools if m in sys.modules])
        print(mha.plot.head_view.__name__, mha.exercises.check_attention.__name__, mha.parallel.shard_heads.__name__,
              mha.english.WordLM.__name__)
        print("in dir(mha):", all(name in dir(mha) for name in ("plot", "exercises", "parallel", "english")))
        print("importlib in dir(mha):", "importlib" in dir(mha))
        try:
            mha.plots
        except AttributeError as err:
            print("AttributeError:", err)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "loaded by import mha: []",
        "head_view check_attention shard_heads WordLM",
        "in dir(mha): True",
        "importlib in dir(mha): False",
        "AttributeError: module 'mha' has no attribute 'plots'",
    ], r.stdout
    assert r.stderr == ""


@pytest.mark.slow  # a fresh interpreter imports torch: seconds
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


@pytest.mark.parametrize("name", ["plot", "exercises", "parallel", "english"])
def test_a_lazy_submodule_is_the_module_that_import_gives(name):
    import importlib

    import mha

    assert getattr(mha, name) is importlib.import_module(f"mha.{name}")


def test_the_import_contracts_hold():
    """lint-imports checks pyproject.toml's contracts against this checkout's mha."""
    lint = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports not found: pip install -e '.[test]' installs import-linter"
    r = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
