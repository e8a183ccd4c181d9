"""notebooks/execute.py: a re-run stores the same file unless something really changed; a failure is one line that
names the notebook and the cell; the kernel is the interpreter that runs execute.py (C20, C26)."""

import importlib.util
import io
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import coalesce_streams
from tqdm import tqdm

SCRIPT = Path(__file__).resolve().parents[1] / "notebooks" / "execute.py"
_spec = importlib.util.spec_from_file_location("execute", SCRIPT)
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)


def test_progress_bar_is_stored_as_its_final_line_as_nbval_reads_it():
    buf = io.StringIO()  # what a tqdm loop really writes: a redraw per step, each starting with a carriage return
    bar = tqdm(range(40), file=buf, mininterval=0, ncols=70, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}")
    for i in bar:
        bar.set_postfix(loss=f"{1000 / (i + 1):.1f}")  # the postfix gets shorter: tqdm pads the line
    bar.close()
    shown = execute.as_displayed(buf.getvalue())
    assert "\r" not in shown and shown.count("\n") == 1 and "40/40" in shown and "loss=25.0" in shown
    # nbval compares its own reading of the live stream with the stored text: they must agree.
    assert shown == coalesce_streams([nbformat.v4.new_output("stream", name="stdout", text=buf.getvalue())])[0].text
    # As a front end shows them: a carriage return overwrites, a backspace erases.
    assert [execute.as_displayed(s) for s in ("abcdef\rXY", "one\r\ntwo\n", "abx\x08c\n")] == ["XYcdef", "one\ntwo\n",
                                                                                              "abc\n"]


def test_outputs_that_differ_only_in_their_numbers_count_as_the_same():
    def out(text):
        return [nbformat.v4.new_output("stream", name="stdout", text=text)]

    timed = out("explicit: 71.3 ms  fused: 37.2 ms\n")
    assert execute.same_but_numbers(timed, out("explicit: 105.27 ms  fused: 8.0 ms\n"))
    assert not execute.same_but_numbers(timed, out("explicit: 71.3 ms  fused: n/a\n"))


def notebook(tmp_path, *sources, tags=None, name="nb.ipynb"):
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    for i, cell_tags in (tags or {}).items():
        cells[i].metadata["tags"] = cell_tags
    path = tmp_path / name
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def run_execute(*args, python=sys.executable, env=None):
    return subprocess.run([str(python), str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.slow
def test_rerun_leaves_the_notebook_unchanged(tmp_path):
    progress = ("import sys\nfrom tqdm import tqdm\nfor i in tqdm(range(30), file=sys.stdout, mininterval=0, "
                "bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt}'):\n    pass")
    timing = "# NBVAL_IGNORE_OUTPUT\nimport time\nprint('clock:', time.perf_counter_ns(), 'ns')"
    path = notebook(tmp_path, progress, timing, name="t.ipynb")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert run_execute(path).returncode == 0
    subprocess.run([*git, "add", "t.ipynb"], check=True)
    subprocess.run([*git, "commit", "-qm", "executed"], check=True)
    first = path.read_text()
    bar, clock = (c.outputs for c in nbformat.read(path, as_version=4).cells)
    assert len(bar) == 1 and bar[0].text.endswith("30/30\n") and "\r" not in bar[0].text
    assert clock[0].text.startswith("clock: ")
    assert run_execute(path).returncode == 0 and path.read_text() == first  # the clock moved on: only its numbers
    assert run_execute("--refresh-timing", path).returncode == 0
    assert nbformat.read(path, as_version=4).cells[1].outputs != clock  # asked for: new numbers
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("perf_counter_ns()", "perf_counter_ns() // 10")
    nbformat.write(nb, path)
    assert run_execute(path).returncode == 0
    assert nbformat.read(path, as_version=4).cells[1].outputs != nb.cells[1].outputs  # code changed: new output


C20 = {  # before: a 33-line traceback through nbclient and asyncio, with colour codes, that never named the notebook
    "a cell raises": (["x = 1", "# the mistake\ny = x / 0\nprint('unreached')", "print('after')"], {},
                      "cell 1 ('# the mistake') raised ZeroDivisionError: division by zero"),
    # before: a 19-line asyncio traceback ending in nbclient's DeadKernelError
    "the kernel dies": (["x = 1", "import os; os._exit(1)", "print('after')"], {},
                        "cell 1 ('import os; os._exit(1)'): the kernel died (os._exit, a crash, or out of memory)"),
    # before: the first cell with an error output was blamed, here the one tagged raises-exception
    "after an expected error": (["raise ValueError('expected')", "x = 1", "1 / 0"], {0: ["raises-exception"]},
                                "cell 2 ('1 / 0') raised ZeroDivisionError: division by zero"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", C20)
def test_C20_a_failing_notebook_is_one_line_naming_it_and_the_cell_then_the_cells_own_traceback(case, tmp_path):
    """The case: a notebook whose cell fails; execute.py exits 1, its first line naming the notebook and the cell, then
    at most the cell's own traceback as a reader of the notebook would see it; the notebook is left as it was."""
    sources, tags, said = C20[case]
    path = notebook(tmp_path, *sources, tags=tags)
    before = path.read_bytes()
    r = run_execute(path)
    first, *rest = r.stderr.splitlines()
    assert r.returncode == 1 and r.stdout == "" and path.read_bytes() == before
    assert first == f"execute.py: {path}: {said} (the notebook was not changed)"
    assert "\x1b[" not in r.stderr and len(rest) < 12 and "ValueError" not in r.stderr, r.stderr
    assert not [line for line in rest if any(w in line for w in ("nbclient", "asyncio", "execute.py", "WARNING"))]
    if case == "a cell raises":
        assert "----> 2 y = x / 0" in r.stderr and rest[-1] == "ZeroDivisionError: division by zero"


@pytest.mark.slow  # two starts of execute.py, about 4 s each
def test_C20_a_file_that_is_not_a_notebook_or_does_not_exist_is_one_line(tmp_path):
    # Before: 37 lines of nbformat's traceback for invalid JSON, 21 for a missing file.
    bad = tmp_path / "bad.ipynb"
    bad.write_text("not json\n")
    r = run_execute(bad)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"execute.py: {bad}: not a notebook nbformat can read (Notebook does not appear to be JSON: 'not json\\n') "
        "(the notebook was not changed)"]
    # A missing notebook is a usage error (argparse's status 2), found before any notebook runs.
    r = run_execute(bad, tmp_path / "missing.ipynb")
    missing = tmp_path / "missing.ipynb"
    assert r.returncode == 2 and r.stderr.splitlines() == [f"execute.py: error: no such notebook: {missing}"]
    assert bad.read_text() == "not json\n"


# --- C26: the kernel is the interpreter that runs execute.py ------------------------------------------------------


def layout(kind: str, tmp_path: Path) -> tuple[Path, dict]:
    """An interpreter to start execute.py with, and its environment, where a user-level "python3" kernelspec (as
    `ipykernel install --user` writes it) names another interpreter, this test's: a virtual environment of its own
    (it borrows this one's packages), or this installation's python under another name, outside any venv (a system
    Python, conda's base environment with conda-meta/ and CONDA_PREFIX)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CONDA", "VIRTUAL_ENV"))}
    prefix = tmp_path / kind.replace(",", "").replace(" ", "-")
    if kind.startswith("virtual environment"):
        env["JUPYTER_PREFER_ENV_PATH"] = "0"  # the case: Jupyter then looks at the user's kernelspecs first
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
        (purelib,) = prefix.glob("lib/python*/site-packages")
        (purelib / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        python = prefix / "bin" / "python"
    else:
        (prefix / "bin").mkdir(parents=True)
        python = prefix / "bin" / "python3"
        python.symlink_to(getattr(sys, "_base_executable", None) or os.path.realpath(sys.executable))
        env["PYTHONPATH"] = os.pathsep.join([*site.getsitepackages(), env.get("PYTHONPATH", "")])
        if kind == "conda base":
            (prefix / "conda-meta").mkdir()
            env.update(CONDA_PREFIX=str(prefix), CONDA_DEFAULT_ENV="base", CONDA_SHLVL="1")
        else:
            env["JUPYTER_PREFER_ENV_PATH"] = kind[-1]
    data = tmp_path / "home" / ".local" / "share" / "jupyter"
    (data / "kernels" / "python3").mkdir(parents=True)
    (data / "kernels" / "python3" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (another environment)", "language": "python"}))
    return python, {**env, "HOME": str(tmp_path / "home"), "JUPYTER_DATA_DIR": str(data)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["virtual environment, prefer env 0", "conda base", "system, prefer env 0",
                                  "system, prefer env 1"])
def test_C26_execute_runs_its_own_interpreter_not_the_python3_kernel_jupyter_finds_first(kind, tmp_path):
    """The case: Jupyter looks at the user's kernelspecs first (a system Python, conda's base environment, or
    JUPYTER_PREFER_ENV_PATH=0), where `ipykernel install --user` left another environment's "python3". Before,
    execute.py ran the notebook there, and CI then checked its outputs in this interpreter."""
    python, env = layout(kind, tmp_path)
    path = notebook(tmp_path, "import sys\nprint(sys.executable)", name="who.ipynb")
    r = run_execute(path, python=python, env=env)
    assert r.returncode == 0 and r.stdout == "executed who.ipynb\n", r.stderr[-3000:]
    (out,) = nbformat.read(path, as_version=4).cells[0].outputs
    assert out.text.strip() == str(python)


@pytest.mark.slow
def test_C26_a_kernel_that_does_not_start_is_one_line_naming_the_notebook(tmp_path):
    """Before: nbclient's multi-line traceback ending in "RuntimeError: Kernel died before replying to kernel_info",
    and another one at exit. Here ipykernel_launcher is shadowed by a module that fails as a missing ipykernel does."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ipykernel_launcher.py").write_text(
        "import sys\nprint('Traceback (most recent call last):', file=sys.stderr)\n"
        "print(\"ModuleNotFoundError: No module named 'ipykernel'\", file=sys.stderr)\nsys.exit(1)\n")
    path = notebook(tmp_path, "print('never')")
    before = path.read_bytes()
    shadowed = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    r = run_execute(path, env={**os.environ, "PYTHONPATH": shadowed})
    assert r.returncode == 1 and r.stdout == "" and path.read_bytes() == before
    assert r.stderr.splitlines() == [
        f"execute.py: {path}: the kernel did not start ({sys.executable} -m ipykernel_launcher): Kernel died before "
        "replying to kernel_info; it said: ModuleNotFoundError: No module named 'ipykernel' (the notebook was not "
        "changed)"]
