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


def cells(path, kind=None):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def source(cell):
    return "".join(cell["source"])


def test_the_series_is_there():
    names = [p.name for p in NOTEBOOKS]
    for prefix in ["01_", "02_multi_head_attention", "03_masks_and_padding", "04_", "05_"]:
        assert any(n.startswith(prefix) for n in names), prefix


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_title_and_colab_badge_point_at_the_project(path):
    first = source(cells(path)[0])
    assert cells(path)[0]["cell_type"] == "markdown" and first.startswith("# ")
    # The badge, not links to other notebooks (which are Colab URLs too)
    badge = r"\[!\[Open In Colab\]\([^)]*\)\]\(https://colab\.research\.google\.com/github/([^)\s]+)\)"
    badges = re.findall(badge, first)
    assert badges == [f"{GITHUB_PATH}/blob/main/notebooks/{path.name}"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_install_cell_is_guarded_and_uses_the_project_url(path):
    install = source(cells(path, "code")[0])
    assert 'if "google.colab" in sys.modules:' in install
    urls = re.findall(r"pip install .*?(git\+\S+)", install)
    assert urls == [f"git+{REPO_URL}"]
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
