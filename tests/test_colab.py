"""Every chapter runs in Colab with nothing but its own install cell: simulated here, without network.

The simulation: a fresh venv with torch preinstalled (this environment's, from local disk) and what Colab also has
(ipykernel, matplotlib, tqdm, numpy), but not mha; a stand-in ``google.colab`` that the kernel imports at start-up,
as Colab's does; each notebook copied alone into an empty folder and run as committed. pip's only index is a local
folder (PEP 503), and git's github.com a local repository (``url.<base>.insteadOf`` in the kernel's environment).
Three kernels, one per way the install cell can go:

- ``colab``: the index serves the wheel built from this working tree: the release is installed, torch kept as it was;
- ``unpublished``: the index has no such release (only setuptools, for a build from source): the package is
  installed from the repository, a git repository of this working tree;
- ``offline``: neither the index nor GitHub answers: one clear error, pip's reason and what to do; nothing else runs.

It takes minutes, so it runs only with ``--colab`` (``make colab``).
"""

import hashlib
import json
import os
import re
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

pytestmark = pytest.mark.slow  # minutes, with --colab: never part of the fast tier

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "mha" / "__init__.py").read_text()).group(1)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))  # the chapters; their solutions run in make test and floor
REPO = re.search(r'Homepage = "([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
COLAB_HAS = ["ipykernel", "matplotlib", "tqdm"]  # besides torch; all preinstalled in Colab
CLOSED = "http://127.0.0.1:9/"  # nothing listens there: every connection is refused at once


def run(*cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], **{"capture_output": True, **kw}, text=True)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def snapshot(root: Path) -> tuple[Path, Path, str]:
    """The working tree as it is, committed or not: a git repository of it (the notebooks' GitHub), its HEAD, and
    the wheel built from it as a release builds it (sdist, then wheel)."""
    repo = root / "repo"
    for rel in run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines():
        if (ROOT / rel).is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    git = ["git", "-C", repo, "-c", "user.name=colab", "-c", "user.email=colab@localhost"]
    run(*git, "init", "-q")
    run(*git, "add", "-A")
    run(*git, "commit", "-q", "-m", "the working tree")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", repo)
    (wheel,) = (root / "dist").glob("*.whl")
    assert wheel.name == f"mha-{VERSION}-py3-none-any.whl"
    return repo, wheel, run(*git, "rev-parse", "HEAD").strip()


def simple_index(folder: Path, files: dict[str, list[Path]]) -> str:
    """A PEP 503 index in ``folder``, serving ``files`` per project: what pip sees at pypi.org/simple."""
    folder.mkdir(parents=True)
    for project, paths in files.items():
        (folder / project).mkdir()
        links = ""
        for path in paths:
            shutil.copy2(path, folder / project / path.name)
            links += f'<a href="{path.name}#sha256={hashlib.sha256(path.read_bytes()).hexdigest()}">{path.name}</a>'
        (folder / project / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>\n")
    projects = "".join(f'<a href="{p}/">{p}</a>' for p in files)
    (folder / "index.html").write_text(f"<!DOCTYPE html><html><body>{projects}</body></html>\n")
    return folder.as_uri()


def git_urls(*pairs) -> dict[str, str]:
    """git configuration in the environment: each (base, prefix) makes URLs that start with prefix use base."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs)), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    for i, (base, prefix) in enumerate(pairs):
        env |= {f"GIT_CONFIG_KEY_{i}": f"url.{base}.insteadOf", f"GIT_CONFIG_VALUE_{i}": prefix}
    return env


@pytest.fixture(scope="module")
def colab(request, tmp_path_factory):
    if not request.config.getoption("--colab"):
        pytest.skip("runs every notebook in a fresh venv (minutes): pass --colab (make colab does)")
    root = tmp_path_factory.mktemp("colab")
    venv, python = root / "venv", root / "venv" / "bin" / "python"
    run(sys.executable, "-m", "venv", venv)
    run(python, "-m", "pip", "install", "-q", f"torch=={torch.__version__}", *COLAB_HAS)
    repo, wheel, head = snapshot(root)
    # setuptools, for pip's build of the repository (pyproject's build-system), from this machine's package index.
    run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", root / "setuptools",
        re.search(r'requires = \["([^"]+)"\]', (ROOT / "pyproject.toml").read_text()).group(1))
    # The kernels inherit this process's environment: none of this machine's pip settings (indexes, find-links)
    # may reach the notebooks' pip, so that the local index is all it can see.
    unset = pytest.MonkeyPatch()
    request.addfinalizer(unset.undo)
    for key in [k for k in os.environ if k.startswith(("PIP_", "GIT_CONFIG"))]:
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
    offline_git = git_urls((CLOSED, "https://github.com/"))  # any repository on GitHub: refused
    kernels = {
        "colab": {**env, **offline_git, "PIP_INDEX_URL": simple_index(root / "index", {"mha": [wheel]})},
        "unpublished": {**env, **git_urls((CLOSED, "https://github.com/"), (repo.as_uri(), REPO)),  # but this one
                        "PIP_INDEX_URL": simple_index(root / "unpublished", {
                            "setuptools": list((root / "setuptools").glob("*.whl"))})},
        # pip retries as in Colab (5 times, by default), quickly here: the cell reads what the last attempt said.
        "offline": {**env, **offline_git, "PIP_INDEX_URL": CLOSED + "simple/", "PIP_TIMEOUT": "2"},
    }
    for name, kernel_env in kernels.items():
        (root / "kernels" / name).mkdir(parents=True)
        (root / "kernels" / name / "kernel.json").write_text(json.dumps({
            "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Colab (simulated, {name})", "language": "python", "env": kernel_env,
        }))
    return {"root": root, "python": python, "env": {**os.environ, **kernels["colab"]}, "head": head,
            "torch": torch_identity(python, root)}


def torch_identity(python, where):
    """Version, path and modification time of the installed torch: a reinstall of the same version changes the last."""
    code = "import os, torch; print(torch.__version__, torch.__file__, os.stat(torch.__file__).st_mtime_ns)"
    return run(python, "-c", code, cwd=where)


def mha_installed(colab):
    """The installed mha's version and file, and how pip got it (direct_url.json: from a repository), or None."""
    code = ("import importlib.metadata as m, json, mha; d = m.distribution('mha').read_text('direct_url.json');"
            "print(json.dumps([mha.__version__, mha.__file__, d and json.loads(d)]))")
    r = subprocess.run([str(colab["python"]), "-c", code], env=colab["env"], cwd=colab["root"], capture_output=True,
                       text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None


def fresh_notebook(colab, path, cells=None):
    """mha uninstalled (and shown not importable), the notebook copied alone into an empty folder: its code as
    committed, its outputs cleared; with ``cells``, only its install cell and then these."""
    subprocess.run([str(colab["python"]), "-m", "pip", "uninstall", "-q", "-y", "mha"], env=colab["env"],
                   capture_output=True)
    assert mha_installed(colab) is None, "mha is importable before the install cell runs"
    folder = colab["root"] / path.stem
    folder.mkdir(exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert f'"mha=={VERSION}"' in code[0].source  # the install cell, pinned to this release
    if cells is not None:
        nb.cells = [code[0], *map(nbformat.v4.new_code_cell, cells)]
    for cell in nb.cells:  # the stored outputs cleared, so that what a run leaves is what it did
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb, folder


def execute(colab, nb, folder, kernel):
    km = KernelManager(kernel_name=kernel,
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(colab["root"] / "kernels")]))
    NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(folder)}}).execute()
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_colab_with_only_its_install_cell(path, colab):
    nb, folder = fresh_notebook(colab, path)
    code = execute(colab, nb, folder, "colab")  # raises CellExecutionError, with the cell and traceback, if any fails
    assert not [o.text for c in code for o in c.outputs if o.get("name") == "stderr"]
    version, file, direct = mha_installed(colab)
    assert version == VERSION and str(colab["root"] / "venv") in file and direct is None  # the release, from the index
    assert torch_identity(colab["python"], folder) == colab["torch"]  # Colab's torch is untouched


def test_without_the_release_on_the_index_the_cell_installs_the_package_from_the_repository(colab):
    nb, folder = fresh_notebook(colab, NOTEBOOKS[0], ["import mha\nprint(mha.__version__)"])
    install, check = execute(colab, nb, folder, "unpublished")
    assert install.outputs == [] and [o.text for o in check.outputs] == [f"{VERSION}\n"]
    version, file, direct = mha_installed(colab)
    assert version == VERSION and direct["url"] == REPO and direct["vcs_info"]["commit_id"] == colab["head"]
    assert torch_identity(colab["python"], folder) == colab["torch"]


def test_a_runtime_that_cannot_connect_gets_one_error_with_pips_reason_and_what_to_do(colab):
    nb, folder = fresh_notebook(colab, NOTEBOOKS[0], ["print('after')"])
    with pytest.raises(CellExecutionError):
        execute(colab, nb, folder, "offline")
    install, after = [c for c in nb.cells if c.cell_type == "code"]
    (error,) = [o for o in install.outputs if o.output_type == "error"]
    print(f"{error.ename}: {error.evalue}")
    assert error.ename == "RuntimeError" and "\x1b[" not in error.evalue  # pip's words, uncoloured
    assert error.evalue.startswith("pip could not install mha, which the cells below need. pip said:\n")
    assert "Failed to connect to 127.0.0.1 port 9" in error.evalue  # git's reason, through pip: the repository too
    assert "check that this runtime can reach the internet" in error.evalue and "run this cell again" in error.evalue
    assert after.execution_count is None and not after.outputs  # the cell after it did not run
    assert mha_installed(colab) is None and torch_identity(colab["python"], folder) == colab["torch"]
