"""Every chapter runs in Colab with nothing but its own install cell: simulated here, without network.

The simulation: a fresh venv with torch preinstalled (this environment's torch, from local disk) and what Colab
also has (ipykernel, matplotlib, tqdm, and so numpy), but not mha; a stand-in ``google.colab`` module that the
kernel imports at start-up, as Colab's does; each notebook copied alone into an empty folder and run as committed.
Its install cell runs ``pip install mha==<version>``, and pip's only index is a local one (PEP 503, a folder)
serving the wheel built from this working tree: the cell must install the package by its pinned name, and keep
the preinstalled torch exactly as it was (version, path, file).

The failure paths: the same install cell with an index that has no such release (an empty one: the release is not
published yet), and with an index it cannot reach (a closed port on 127.0.0.1), each raises one clear error that names
the package, says which of the two went wrong and what to do, and no cell after it runs.

It takes minutes, so it runs only with ``--colab`` (.ci/run does).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from test_notebooks import NOTEBOOKS, VERSION, cells, source

pytestmark = pytest.mark.slow  # minutes, with --colab: never part of the fast tier

ROOT = Path(__file__).resolve().parents[1]
PINNED = f"mha=={VERSION}"
COLAB_HAS = ["ipykernel", "matplotlib", "tqdm"]  # besides torch; all preinstalled in Colab


def run(*cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], **{"capture_output": True, **kw}, text=True)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def build_wheel(root: Path) -> Path:
    """The wheel of the working tree as it is, committed or not, built as a release builds it (sdist, then wheel)."""
    checkout = root / "checkout"
    for rel in run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines():
        if (ROOT / rel).is_file():
            (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, checkout / rel)
    dist = root / "dist"
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, checkout)
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"mha-{VERSION}-py3-none-any.whl"
    return wheel


def simple_index(root: Path, wheel: Path) -> Path:
    """A PEP 503 index, as a folder, with one project and one file: what pip sees at pypi.org/simple."""
    project = root / "index" / "simple" / "mha"
    project.mkdir(parents=True)
    shutil.copy2(wheel, project / wheel.name)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (project / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>\n')
    (project.parent / "index.html").write_text('<!DOCTYPE html><html><body><a href="mha/">mha</a></body></html>\n')
    return project.parent


@pytest.fixture(scope="module")
def colab(request, tmp_path_factory):
    if not request.config.getoption("--colab"):
        pytest.skip("runs every notebook in a fresh venv (minutes): pass --colab (.ci/run does)")
    root = tmp_path_factory.mktemp("colab")
    venv, python = root / "venv", root / "venv" / "bin" / "python"
    run(sys.executable, "-m", "venv", venv)
    run(python, "-m", "pip", "install", "-q", f"torch=={torch.__version__}", *COLAB_HAS)
    index = simple_index(root, build_wheel(root))
    # The kernels inherit this process's environment: none of this machine's pip settings (indexes, find-links)
    # may reach the notebooks' pip, so that the local index below is all it can see.
    unset = pytest.MonkeyPatch()
    request.addfinalizer(unset.undo)
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        unset.delenv(key)

    stub = root / "colab-stub" / "google" / "colab"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('"""Stand-in for google.colab: notebooks only ask if it is imported."""\n')
    startup = root / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # noqa: F401  (Colab's kernel imports it at start)\n")
    env = {
        "PYTHONPATH": str(stub.parents[1]),  # the stand-in only: not this checkout, so mha is not importable
        "IPYTHONDIR": str(root / "ipython"),
        "PIP_CONFIG_FILE": os.devnull,  # no pip configuration of this machine (indexes, find-links, constraints)
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        # What a notebook starts by name (`!pip`, `python`) is the runtime's own interpreter, as in Colab, not the one
        # of the process that started the kernel, which PATH would find first (case C26).
        "PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", "")]),
        "VIRTUAL_ENV": str(venv),
    }
    kernels = root / "kernels"
    online = {**env, "PIP_INDEX_URL": index.as_uri()}  # the local index stands in for PyPI
    empty = root / "empty-index" / "simple"  # an index without mha: what pip sees before the release is published
    empty.mkdir(parents=True)
    (empty / "index.html").write_text("<!DOCTYPE html><html><body></body></html>\n")
    unpublished = {**env, "PIP_INDEX_URL": empty.as_uri()}
    # An index pip cannot reach: port 9 of 127.0.0.1, where nothing listens, so every connection is refused at once.
    # pip retries as in Colab (5 times, by default), quickly here: each retry's warning is what the cell reads.
    offline = {**env, "PIP_INDEX_URL": "http://127.0.0.1:9/simple/", "PIP_TIMEOUT": "2"}
    for name, kernel_env in (("colab", online), ("colab-unpublished", unpublished), ("colab-offline", offline)):
        (kernels / name).mkdir(parents=True)
        (kernels / name / "kernel.json").write_text(json.dumps({
            "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Colab (simulated, {name})", "language": "python", "env": kernel_env,
        }))
    return {"root": root, "python": python, "env": {**os.environ, **online}, "kernels": kernels,
            "torch": torch_identity(python)}


def torch_identity(python):
    """Version, path and modification time of the installed torch: a reinstall of the same version changes the last."""
    code = "import os, torch; print(torch.__version__, torch.__file__, os.stat(torch.__file__).st_mtime_ns)"
    return run(python, "-c", code, cwd=python.parents[2] / "kernels")


def fresh_notebook(colab, path):
    """mha uninstalled (and shown not importable), the notebook copied alone into an empty folder: its code as
    committed, its outputs cleared."""
    outside = {"env": colab["env"], "cwd": colab["root"] / "kernels", "capture_output": True}  # no mha/ here
    subprocess.run([str(colab["python"]), "-m", "pip", "uninstall", "-q", "-y", "mha"], **outside)
    absent = subprocess.run([str(colab["python"]), "-c", "import mha"], **outside)
    assert absent.returncode != 0, "mha is importable before the install cell runs"
    folder = colab["root"] / path.stem
    folder.mkdir(exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    install = next(c for c in nb.cells if c.cell_type == "code")
    assert install.source == source(cells(path, "code")[0]) and install.source.count(f'"{PINNED}"') == 1
    for cell in nb.cells:  # the stored outputs cleared, so that what a run leaves is what it did
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, folder / path.name)
    return nb, folder, outside


def client(colab, nb, folder, kernel):
    km = KernelManager(kernel_name=kernel, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(colab["kernels"])]))
    return NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(folder)}})


# The chapters. Their solutions have the same install cell and import only what Colab has, opening no file
# (tests/test_notebooks.py checks both), and steps 1 and 4 of .ci/run run them: here they would add minutes to CI.
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_colab_with_only_its_install_cell(path, colab):
    nb, folder, outside = fresh_notebook(colab, path)
    client(colab, nb, folder, "colab").execute()  # raises CellExecutionError, with the cell and traceback, if any fails

    stderr = [o.text for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("name") == "stderr"]
    assert not stderr, stderr
    installed = run(colab["python"], "-c", "import mha; print(mha.__version__, mha.__file__)", **outside).split()
    assert installed[0] == VERSION and str(colab["root"] / "venv") in installed[1]  # installed, not borrowed
    assert torch_identity(colab["python"]) == colab["torch"]  # Colab's torch is untouched


def failed_install(colab, kernel):
    """Run a notebook in ``kernel``, whose pip cannot install mha: the install cell's error, after checking that it is
    the only error, that it stopped the run, and that nothing was installed or changed."""
    path = NOTEBOOKS[1]  # every notebook has this same install cell (tests/test_notebooks.py)
    nb, folder, outside = fresh_notebook(colab, path)
    with pytest.raises(CellExecutionError) as failed:
        client(colab, nb, folder, kernel).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o) for i, c in enumerate(code) for o in c.outputs if o.output_type == "error"]
    assert [i for i, _ in errors] == [0], "the error is not the install cell's alone"
    error = errors[0][1]
    print(f"{error.ename}: {error.evalue}")
    assert error.ename == "RuntimeError" and failed.value.ename == "RuntimeError"
    assert "\x1b[" not in error.evalue  # pip's words, uncoloured
    assert all(c.execution_count is None and not c.outputs for c in code[1:]), "cells after the install cell ran"
    assert subprocess.run([str(colab["python"]), "-c", "import mha"], **outside).returncode != 0
    assert torch_identity(colab["python"]) == colab["torch"]
    return error.evalue


def test_a_release_the_index_does_not_have_is_named_as_such_with_what_to_do_instead(colab):
    said = failed_install(colab, "colab-unpublished")
    # What failed (the pinned package, and pip's own reason), which failure it is, and what to do.
    assert f"pip reached the package index but found no release {PINNED}, which the cells below need" in said
    assert "not published yet, or the version is wrong" in said
    assert "(from versions: none)" in said and "No matching distribution found for " + PINNED in said
    assert "%pip install -q https://github.com/transformer-on-ramp/mha/archive/refs/heads/main.zip" in said
    assert "internet" not in said and "run this cell again" not in said  # not the other failure's advice


def test_an_index_that_cannot_be_reached_is_named_as_such_with_what_to_do(colab):
    said = failed_install(colab, "colab-offline")
    assert f"pip could not reach the package index to install {PINNED}, which the cells below need" in said
    assert "Connection refused" in said  # pip's own reason, quoted
    assert "Check that this runtime can reach the internet" in said and "then run this cell again" in said
    assert "not published" not in said and "%pip install" not in said


def test_the_kernel_and_what_it_starts_by_name_run_in_the_colab_interpreter(colab):
    """Case C26's kind: the simulated runtime's kernel is its venv's python, and so are the `python` and `pip` that a
    notebook's processes find on PATH (this process's own interpreter, found first before, had every package)."""
    who = ("import shutil, subprocess, sys\n"
           "print(sys.executable)\n"
           "print(shutil.which('python'))\n"
           "print(subprocess.run(['pip', '--version'], capture_output=True, text=True).stdout.split()[3])")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(who)])
    folder = colab["root"] / "who"
    folder.mkdir(exist_ok=True)
    client(colab, nb, folder, "colab").execute()
    executable, python, pip = "".join(o.text for o in nb.cells[0].outputs if o.output_type == "stream").split()
    venv = colab["root"] / "venv"
    assert executable == str(colab["python"]) and python == str(venv / "bin" / "python")
    assert pip.startswith(str(venv / "lib")), pip  # pip's package, in the venv's site-packages
