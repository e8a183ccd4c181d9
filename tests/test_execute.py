"""notebooks/execute.py: a re-run stores the same file unless something really changed; it runs its own interpreter."""

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


def tqdm_output(n=40):
    """What a tqdm loop really writes: a redraw per step, each starting with a carriage return."""
    buf = io.StringIO()
    bar = tqdm(range(n), file=buf, mininterval=0, ncols=70, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}")
    for i in bar:
        bar.set_postfix(loss=f"{1000 / (i + 1):.1f}")  # the postfix gets shorter: tqdm pads the line
    bar.close()
    return buf.getvalue()


def test_progress_bar_is_stored_as_its_final_line_as_nbval_reads_it():
    raw = tqdm_output()
    assert raw.count("\r") > 40
    shown = execute.as_displayed(raw)
    assert "\r" not in shown and shown.count("\n") == 1
    assert "40/40" in shown and "loss=25.0" in shown
    # nbval compares its own reading of the live stream with the stored text: they must agree.
    live = coalesce_streams([nbformat.v4.new_output("stream", name="stdout", text=raw)])[0].text
    assert shown == live


def test_carriage_return_overwrites_and_backspace_erases_as_in_a_front_end():
    assert execute.as_displayed("abcdef\rXY") == "XYcdef"
    assert execute.as_displayed("one\r\ntwo\n") == "one\ntwo\n"
    assert execute.as_displayed("abx\x08c\n") == "abc\n"


def test_outputs_that_differ_only_in_their_numbers_count_as_the_same():
    out = [nbformat.v4.new_output("stream", name="stdout", text="explicit: 71.3 ms  fused: 37.2 ms\n")]
    other = [nbformat.v4.new_output("stream", name="stdout", text="explicit: 105.27 ms  fused: 8.0 ms\n")]
    worded = [nbformat.v4.new_output("stream", name="stdout", text="explicit: 71.3 ms  fused: n/a\n")]
    assert execute.same_but_numbers(out, other)
    assert not execute.same_but_numbers(out, worded)


def run_execute(path, *args):
    r = subprocess.run([sys.executable, str(SCRIPT), *args, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.slow
def test_rerun_leaves_the_notebook_unchanged(tmp_path):
    progress = (
        "import sys\nfrom tqdm import tqdm\n"
        "for i in tqdm(range(30), file=sys.stdout, mininterval=0, bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt}'):\n"
        "    pass"
    )
    timing = "# NBVAL_IGNORE_OUTPUT\nimport time\nprint('clock:', time.perf_counter_ns(), 'ns')"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(progress), nbformat.v4.new_code_cell(timing)])
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)

    run_execute(path)
    subprocess.run([*git, "add", "t.ipynb"], check=True)
    subprocess.run([*git, "commit", "-qm", "executed"], check=True)
    first = path.read_text()
    bar, clock = (c.outputs for c in nbformat.read(path, as_version=4).cells)
    assert len(bar) == 1 and bar[0].text.endswith("30/30\n") and "\r" not in bar[0].text
    assert clock[0].text.startswith("clock: ")

    run_execute(path)
    assert path.read_text() == first  # the clock moved on, but only its numbers changed

    run_execute(path, "--refresh-timing")
    assert nbformat.read(path, as_version=4).cells[1].outputs != clock  # asked for: new numbers

    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("perf_counter_ns()", "perf_counter_ns() // 10")
    nbformat.write(nb, path)
    run_execute(path)
    new = nbformat.read(path, as_version=4).cells[1].outputs
    assert new != nb.cells[1].outputs  # the code changed since the commit: its new output is stored


@pytest.mark.slow
def test_C20_a_failing_cell_is_named_with_its_notebook_and_error(tmp_path):
    """The case: a notebook whose second cell is 1 / 0. Before: exit 1 after a 33-line traceback through nbclient and
    asyncio, with colour codes, that never named the notebook."""
    cells = [
        nbformat.v4.new_markdown_cell("# A notebook"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("# the mistake\ny = x / 0\nprint('unreached')"),
        nbformat.v4.new_code_cell("print('after')"),
    ]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    before = path.read_bytes()

    r = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    first, *rest = r.stderr.splitlines()
    assert first == (f"execute.py: {path}: cell 2 ('# the mistake') raised ZeroDivisionError: division by zero "
                     "(the notebook was not changed)")
    # Then the cell's own traceback, as a reader of the notebook would see it, and nothing of the machinery.
    assert "----> 2 y = x / 0" in r.stderr and rest[-1] == "ZeroDivisionError: division by zero"
    assert "\x1b[" not in r.stderr
    assert not [line for line in rest if any(w in line for w in ("nbclient", "asyncio", "execute.py", "WARNING"))]
    assert len(rest) < 12, r.stderr
    assert r.stdout == "" and path.read_bytes() == before


def run_failing(path, *paths):
    r = subprocess.run([sys.executable, str(SCRIPT), str(path), *map(str, paths)], capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stderr.splitlines(), r.stdout


def notebook(tmp_path, *sources, tags=None):
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    for i, cell_tags in (tags or {}).items():
        cells[i].metadata["tags"] = cell_tags
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path, path.read_bytes()


@pytest.mark.slow
def test_C20_a_dead_kernel_is_one_line_naming_the_notebook_and_the_cell(tmp_path):
    # Before: a 19-line asyncio traceback ending in nbclient's DeadKernelError.
    path, before = notebook(tmp_path, "x = 1", "import os; os._exit(1)", "print('after')")
    status, lines, out = run_failing(path)
    assert status == 1 and out == "" and path.read_bytes() == before
    assert lines == [f"execute.py: {path}: cell 1 ('import os; os._exit(1)'): the kernel died (os._exit, a crash, "
                     "or out of memory) (the notebook was not changed)"]


@pytest.mark.slow
def test_C20_the_cell_that_failed_is_named_after_an_expected_error(tmp_path):
    # Before: the first cell with an error output was blamed, here the one tagged raises-exception.
    path, before = notebook(tmp_path, "raise ValueError('expected')", "x = 1", "1 / 0",
                            tags={0: ["raises-exception"]})
    status, lines, _ = run_failing(path)
    assert status == 1 and path.read_bytes() == before
    assert lines[0] == (f"execute.py: {path}: cell 2 ('1 / 0') raised ZeroDivisionError: division by zero "
                        "(the notebook was not changed)")
    assert "ValueError" not in "\n".join(lines)


def test_C20_a_file_that_is_not_a_notebook_or_does_not_exist_is_one_line(tmp_path):
    # Before: 37 lines of nbformat's traceback for invalid JSON, 21 for a missing file.
    bad = tmp_path / "bad.ipynb"
    bad.write_text("not json\n")
    status, lines, _ = run_failing(bad)
    assert status == 1 and lines == [f"execute.py: {bad}: not a notebook nbformat can read (Notebook does not "
                                     "appear to be JSON: 'not json\\n') (the notebook was not changed)"]
    # A missing notebook is a usage error (argparse's status 2), found before any notebook runs.
    status, lines, _ = run_failing(bad, tmp_path / "missing.ipynb")
    assert status == 2 and lines == [f"execute.py: error: no such notebook: {tmp_path / 'missing.ipynb'}"]
    assert bad.read_text() == "not json\n"


# --- C26: the kernel is the interpreter that runs execute.py ------------------------------------------------------

WHO = "import sys\nprint(sys.executable)"  # the notebook: which interpreter runs its kernel


def another_venv(root: Path) -> Path:
    """A virtual environment of its own (sys.prefix differs), which imports this one's packages (ipykernel)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (purelib,) = root.glob("lib/python*/site-packages")
    (purelib / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return root / "bin" / "python"


def a_plain_python(root: Path) -> Path:
    """An interpreter that is in no virtual environment (sys.prefix is its installation's), as a system Python or
    conda's base environment is: this installation's python under another name. PYTHONPATH lends it the packages."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python3"
    python.symlink_to(getattr(sys, "_base_executable", None) or os.path.realpath(sys.executable))
    return python


def a_user_kernelspec(home: Path, python: Path) -> dict:
    """A user-level "python3" kernelspec, as `ipykernel install --user` writes it in another environment, and the
    environment variables that make it this process's user-level Jupyter data."""
    data = home / ".local" / "share" / "jupyter"
    (data / "kernels" / "python3").mkdir(parents=True)
    (data / "kernels" / "python3" / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (another environment)", "language": "python",
    }))
    return {"HOME": str(home), "JUPYTER_DATA_DIR": str(data)}


def ran_in(python, tmp_path, env) -> str:
    """Run execute.py with ``python`` on a notebook that prints its kernel's sys.executable; return that."""
    path = tmp_path / "who.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WHO)]), path)
    r = subprocess.run([str(python), str(SCRIPT), str(path)], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in env.items() if v is not None})
    assert r.returncode == 0 and r.stdout == "executed who.ipynb\n", r.stderr[-3000:]
    (out,) = nbformat.read(path, as_version=4).cells[0].outputs
    return out.text.strip()


def without_jupyter_settings():
    return {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CONDA", "VIRTUAL_ENV"))}


@pytest.mark.slow
def test_C26_execute_runs_its_own_interpreter_not_the_python3_kernel_jupyter_finds_first(tmp_path):
    """The case: Jupyter looks at the user's kernelspecs first (a system Python, conda's base environment, or
    JUPYTER_PREFER_ENV_PATH=0), where `ipykernel install --user` left another environment's "python3". Before,
    execute.py ran the notebook there, and CI then checked its outputs in this interpreter."""
    other = another_venv(tmp_path / "other")
    env = {**without_jupyter_settings(), **a_user_kernelspec(tmp_path / "home", other), "JUPYTER_PREFER_ENV_PATH": "0"}
    assert ran_in(sys.executable, tmp_path, env) == sys.executable


LAYOUTS = ["virtual environment", "conda base", "system, prefer env 0", "system, prefer env 1"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_C26_execute_runs_its_own_interpreter_in_every_layout(layout, tmp_path):
    """The neighbours: execute.py started by a venv's python, conda's (base environment, conda-meta/, CONDA_PREFIX),
    and a system Python with JUPYTER_PREFER_ENV_PATH set either way; each time a user-level "python3" kernelspec
    names another interpreter (this test's own)."""
    env = {**without_jupyter_settings(), **a_user_kernelspec(tmp_path / "home", Path(sys.executable))}
    if layout == "virtual environment":
        python = another_venv(tmp_path / "venv")
    else:
        prefix = tmp_path / layout.split(",")[0]
        python = a_plain_python(prefix)
        env["PYTHONPATH"] = os.pathsep.join([*site.getsitepackages(), env.get("PYTHONPATH", "")])
        if layout == "conda base":
            (prefix / "conda-meta").mkdir()
            env.update(CONDA_PREFIX=str(prefix), CONDA_DEFAULT_ENV="base", CONDA_SHLVL="1")
        else:
            env["JUPYTER_PREFER_ENV_PATH"] = layout[-1]
    assert ran_in(python, tmp_path, env) == str(python)


@pytest.mark.slow
def test_C26_a_kernel_that_does_not_start_is_one_line_naming_the_notebook(tmp_path):
    """Before: nbclient's multi-line traceback ending in "RuntimeError: Kernel died before replying to kernel_info",
    and another one at exit. Here ipykernel_launcher is shadowed by a module that fails as a missing ipykernel does."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ipykernel_launcher.py").write_text(
        "import sys\nprint('Traceback (most recent call last):', file=sys.stderr)\n"
        "print(\"ModuleNotFoundError: No module named 'ipykernel'\", file=sys.stderr)\nsys.exit(1)\n")
    path, before = notebook(tmp_path, "print('never')")
    r = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 1 and r.stdout == "" and path.read_bytes() == before
    assert r.stderr.splitlines() == [
        f"execute.py: {path}: the kernel did not start ({sys.executable} -m ipykernel_launcher): Kernel died before "
        "replying to kernel_info; it said: ModuleNotFoundError: No module named 'ipykernel' (the notebook was not "
        "changed)"]
