"""Static checks on the committed notebooks (nbval runs them; this checks how they are stored)."""

import json
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Homepage"]
GITHUB_PATH = REPO_URL.removeprefix("https://github.com/")
COLAB = f"https://colab.research.google.com/github/{GITHUB_PATH}/blob/main/"
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "mha" / "__init__.py").read_text()).group(1)


def cells(path, kind=None):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def source(cell):
    return "".join(cell["source"])


SERIES = [
    "01_scaled_dot_product_attention",
    "02_multi_head_attention",
    "03_why_several_heads",
    "04_masks_and_padding",
    "05_heads_specialise",
    "06_efficient_attention",
]


def test_the_series_is_there():
    names = [p.stem for p in NOTEBOOKS]
    assert [n for n in names if n in SERIES] == SERIES


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_title_and_colab_badge_point_at_the_project(path):
    first = source(cells(path)[0])
    assert cells(path)[0]["cell_type"] == "markdown" and first.startswith("# ")
    badges = re.findall(r"colab-badge\.svg\)\]\(https://colab\.research\.google\.com/github/([^)\s]+)\)", first)
    assert badges == [f"{GITHUB_PATH}/blob/main/notebooks/{path.name}"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_install_cell_is_guarded_and_uses_the_project_url(path):
    install = source(cells(path, "code")[0])
    assert 'if "google.colab" in sys.modules:' in install
    # Pinned to the release the notebook was executed with, so it never meets a newer library.
    urls = re.findall(r"pip install .*?(git\+\S+)", install)
    assert urls == [f"git+{REPO_URL}@v{VERSION}"]
    # Every URL of the project anywhere in the notebook is the one from pyproject.
    text = path.read_text()
    assert set(re.findall(r"github\.com/([\w.-]+/[\w.-]+?)(?:/|\.git|\b)", text)) <= {GITHUB_PATH}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_as_one_clean_run(path):
    nb = json.loads(path.read_text())
    code = cells(path, "code")
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert "widgets" not in nb["metadata"]
    for c in code:
        assert "execution" not in c["metadata"]
        assert "NBVAL_SKIP" not in source(c)
        assert not [o for o in c["outputs"] if o.get("name") == "stderr" or o["output_type"] == "error"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ignored_outputs_are_only_timing_or_training(path):
    for c in cells(path, "code"):
        src = source(c)
        if "NBVAL_IGNORE_OUTPUT" in src:
            assert re.search(r"tqdm|benchmark|Timer|timeit|perf_counter", src), src[:200]


@pytest.mark.parametrize("path", NOTEBOOKS + [ROOT / "README.md"], ids=lambda p: p.name)
def test_links_to_notebooks_are_absolute_and_exist(path):
    """Relative .ipynb links break in Colab and in copies saved to Drive; absolute ones must point somewhere real."""
    text = path.read_text()
    if path.suffix == ".ipynb":
        text = "\n".join(source(c) for c in cells(path, "markdown"))
    targets = re.findall(r"\]\(([^)\s]+\.ipynb)\)", text)
    assert targets, f"{path.name} links to no notebook"
    for target in targets:
        if path.suffix == ".ipynb":
            assert target.startswith(COLAB), f"{path.name}: relative or foreign notebook link {target}"
        rel = target.removeprefix(COLAB)
        assert (ROOT / rel).is_file(), f"{path.name} links to {target}, which does not exist"
