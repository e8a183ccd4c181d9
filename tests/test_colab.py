"""Every notebook runs in Colab with nothing but its own install cell: simulated here, without network.

The simulation: a fresh venv with torch preinstalled (this environment's torch, from local disk) and what Colab
also has (ipykernel, matplotlib, tqdm), but not mha; a stand-in ``google.colab`` module that the kernel imports at
start-up, as Colab's does; each notebook copied alone into an empty folder; its install cell's URL
(``git+https://github.com/...@v<version>``) replaced by a copy of this working tree. pip then runs with no index
at all (only a folder holding setuptools, for building the package), so it cannot fetch anything: the install
must be satisfied by the preinstalled torch, which must stay exactly as it was (version, path, file).

It takes minutes, so it runs only with ``--colab`` (.ci/run does).
"""

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
from test_notebooks import NOTEBOOKS, REPO_URL, SOLUTIONS, VERSION, cells, source

ROOT = Path(__file__).resolve().parents[1]
INSTALL_URL = f"git+{REPO_URL}@v{VERSION}"
COLAB_HAS = ["ipykernel", "matplotlib", "tqdm"]  # besides torch; all preinstalled in Colab


def run(*cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], **{"capture_output": True, **kw}, text=True)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def colab(request, tmp_path_factory):
    if not request.config.getoption("--colab"):
        pytest.skip("runs every notebook in a fresh venv (minutes): pass --colab (.ci/run does)")
    root = tmp_path_factory.mktemp("colab")
    venv, python = root / "venv", root / "venv" / "bin" / "python"
    run(sys.executable, "-m", "venv", venv)
    run(python, "-m", "pip", "install", "-q", f"torch=={torch.__version__}", *COLAB_HAS)
    wheels = root / "wheels"  # all that pip may use in the notebooks: the build backend, nothing else
    run(python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", wheels,
        "setuptools>=77")

    source_tree = root / "checkout"  # the working tree as it is, committed or not (git+file:// would take HEAD)
    for rel in run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines():
        if (ROOT / rel).is_file():
            (source_tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, source_tree / rel)

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
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    kernels = root / "kernels"
    (kernels / "colab").mkdir(parents=True)
    (kernels / "colab" / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab (simulated)", "language": "python", "env": env,
    }))
    return {"root": root, "python": python, "source": source_tree, "env": {**os.environ, **env},
            "kernels": kernels, "torch": torch_identity(python)}


def torch_identity(python):
    """Version, path and modification time of the installed torch: a reinstall of the same version changes the last."""
    code = "import os, torch; print(torch.__version__, torch.__file__, os.stat(torch.__file__).st_mtime_ns)"
    return run(python, "-c", code, cwd=python.parents[2] / "kernels")


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS, ids=lambda p: p.name)
def test_notebook_runs_in_colab_with_only_its_install_cell(path, colab):
    python, env = colab["python"], colab["env"]
    outside = {"env": env, "cwd": colab["root"] / "kernels", "capture_output": True}  # no mha/ in this folder
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "mha"], **outside)
    absent = subprocess.run([str(python), "-c", "import mha"], **outside)
    assert absent.returncode != 0, "mha is importable before the install cell runs"

    folder = colab["root"] / path.stem  # the notebook alone, in an empty folder
    folder.mkdir()
    nb = nbformat.read(path, as_version=4)
    install = next(c for c in nb.cells if c.cell_type == "code")
    assert install.source.count(INSTALL_URL) == 1 and install.source == source(cells(path, "code")[0])
    install.source = install.source.replace(INSTALL_URL, str(colab["source"]))
    nbformat.write(nb, folder / path.name)

    km = KernelManager(kernel_name="colab", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(colab["kernels"])]))
    client = NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(folder)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails

    stderr = [o.text for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("name") == "stderr"]
    assert not stderr, stderr
    installed = run(python, "-c", "import mha; print(mha.__version__, mha.__file__)", **outside).split()
    assert installed[0] == VERSION and str(colab["root"] / "venv") in installed[1]  # installed, not borrowed
    assert torch_identity(python) == colab["torch"]  # Colab's torch is untouched
