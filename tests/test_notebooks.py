"""Static checks on the committed notebooks and their solutions (nbval runs them; this checks how they are stored)."""

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))  # the chapters
SOLUTIONS = sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))  # one per chapter
EVERY_NOTEBOOK = NOTEBOOKS + SOLUTIONS
REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Homepage"]
GITHUB_PATH = REPO_URL.removeprefix("https://github.com/")
COLAB = f"https://colab.research.google.com/github/{GITHUB_PATH}/blob/main/"
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "mha" / "__init__.py").read_text()).group(1)


def cells(path, kind=None):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def source(cell):
    return "".join(cell["source"])


def name(path):
    """02_multi_head_attention.ipynb, solutions/02_multi_head_attention_solutions.ipynb: the test id."""
    return path.relative_to(ROOT / "notebooks").as_posix()


SERIES = [
    "01_scaled_dot_product_attention",
    "02_multi_head_attention",
    "03_why_several_heads",
    "04_masks_and_padding",
    "05_heads_specialise",
    "06_heads_on_real_english",
    "07_efficient_attention",
    "08_heads_across_devices",
]


def test_the_series_is_there():
    names = [p.stem for p in NOTEBOOKS]
    assert [n for n in names if n in SERIES] == SERIES


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=name)
def test_title_and_colab_badge_point_at_the_project(path):
    first = source(cells(path)[0])
    assert cells(path)[0]["cell_type"] == "markdown" and first.startswith("# ")
    badges = re.findall(r"colab-badge\.svg\)\]\(https://colab\.research\.google\.com/github/([^)\s]+)\)", first)
    assert badges == [f"{GITHUB_PATH}/blob/main/{path.relative_to(ROOT).as_posix()}"]


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=name)
def test_install_cell_is_guarded_and_installs_this_release_from_the_index(path):
    install = source(cells(path, "code")[0])
    assert 'if "google.colab" in sys.modules:' in install
    # Pinned to the release the notebook was executed with, so it never meets a newer library; from the package
    # index by name (tests/test_colab.py installs it so from a local index, and checks the failure path).
    assert '"-m", "pip", "install", "-q", "--no-color", "mha==' in install and "git+" not in install
    assert set(re.findall(r"mha==([\w.]+)", install)) == {VERSION}
    # One install cell for every notebook, so the failure path tested on one notebook is every notebook's.
    assert install == source(cells(NOTEBOOKS[0], "code")[0])
    # Every URL of the project anywhere in the notebook is the one from pyproject.
    text = path.read_text()
    assert set(re.findall(r"github\.com/([\w.-]+/[\w.-]+?)(?:/|\.git|\b)", text)) <= {GITHUB_PATH}


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=name)
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


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=name)
def test_ignored_outputs_are_only_timing_or_training(path):
    for c in cells(path, "code"):
        src = source(c)
        if "NBVAL_IGNORE_OUTPUT" in src:
            assert re.search(r"tqdm|benchmark|Timer|timeit|perf_counter", src), src[:200]


@pytest.mark.parametrize("path", EVERY_NOTEBOOK + [ROOT / "README.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
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


# Exercises (issue 10): every chapter ends with exercises a learner can check, and one solutions notebook, run by CI
# like every other notebook, shows every check passing.
CHAPTERS = [n.split("_")[0] for n in SERIES]
CHECK_CALL = re.compile(r"^(check_\w+)\(", re.M)  # a check cell: at top level, it calls a checker of mha.exercises


def chapter(number):
    found = [p for p in NOTEBOOKS if p.name.startswith(f"{number}_")]
    assert len(found) == 1, f"expected one chapter notebooks/{number}_*.ipynb, found {[p.name for p in found]}"
    return found[0]


def exercises_section(path):
    """The cells from the last level-2 heading on, which must be '## Exercises'."""
    all_cells = cells(path)
    headings = [i for i, c in enumerate(all_cells) if c["cell_type"] == "markdown" and source(c).startswith("## ")]
    assert headings, f"{path.name} has no level-2 heading"
    section = all_cells[headings[-1] :]
    assert source(section[0]).splitlines()[0] == "## Exercises", f"{path.name} does not end with '## Exercises'"
    return section


def checks(some_cells):
    """(checker name, stored result) for each check cell; the result is what the cell displayed last."""
    found = []
    for c in some_cells:
        called = CHECK_CALL.findall(source(c)) if c["cell_type"] == "code" else []
        if called:
            results = [o for o in c["outputs"] if o["output_type"] == "execute_result"]
            shown = ["".join(o["data"].get("text/plain", "")) for o in results]
            found.append((called[-1], shown[-1] if shown else ""))
    return found


@pytest.mark.parametrize("number", CHAPTERS)
def test_chapter_ends_with_exercises_a_learner_can_check(number):
    path = chapter(number)
    section = exercises_section(path)
    results = checks(section)
    assert len(results) >= 2, f"{path.name}: {len(results)} check cells in its Exercises section"
    # As committed, the chapter gives nothing away: the stubs are not implemented yet (a 'find the bug' cell may
    # show the checker failing on the given code), and no check passes.
    assert all(r.startswith(("⏳", "❌")) for _, r in results), results
    assert sum(r.startswith("⏳") for _, r in results) >= 2, results
    # The section links to the chapter's solutions (absolute; test_links_... checks that it exists).
    text = "\n".join(source(c) for c in section if c["cell_type"] == "markdown")
    assert f"({COLAB}notebooks/solutions/{path.stem}_solutions.ipynb)" in text


@pytest.mark.parametrize("number", CHAPTERS)
def test_chapter_has_one_solutions_notebook_where_every_check_passes(number):
    path = chapter(number)
    found = [p.name for p in SOLUTIONS if p.name.startswith(f"{number}_")]
    assert found == [f"{path.stem}_solutions.ipynb"], f"solutions of {path.name}: {found}"
    solution = ROOT / "notebooks" / "solutions" / found[0]
    title = source(cells(path)[0]).splitlines()[0].removeprefix("# ")
    assert source(cells(solution)[0]).splitlines()[0] == f"# Solutions: {title}"
    text = "\n".join(source(c) for c in cells(solution, "markdown"))
    assert f"({COLAB}notebooks/{path.name})" in text, f"{solution.name} does not link back to {path.name}"
    solved = checks(cells(solution))
    assert solved and all(r.startswith("✅") for _, r in solved), solved
    # Every exercise left to the learner in the chapter is solved and checked, by the same checker.
    pending = Counter(checker for checker, r in checks(exercises_section(path)) if r.startswith("⏳"))
    assert not pending - Counter(checker for checker, _ in solved), f"not solved in {solution.name}: {pending}"


# Openings (issue 26): title, badge, what the notebook shows in at most three sentences, and one time line, the same
# format everywhere, so that the reading minutes (measured by readers) have one place to go.
OPENED = ["01", "02", "03", "04", "05", "06", "07", "08"]
TIME_LINE = re.compile(r"^\*\*Time:\*\* about (\d+) minutes to read \(the median of two readers\), exercises not "
                       r"counted; (\d+) s to run on 2 CPU cores\.$", re.M)


@pytest.mark.parametrize("number", OPENED)
def test_opening_says_in_three_sentences_what_it_shows_then_how_long(number):
    first = source(cells(chapter(number))[0])
    assert len(TIME_LINE.findall(first)) == 1, f"{number}: no time line, or more than one, in the first cell"
    paragraphs = first[: TIME_LINE.search(first).start()].strip().split("\n\n")
    shows = paragraphs[-1].replace("e.g.", "eg")
    assert not shows.startswith(("**", "#", "[![")), f"{number}: no paragraph saying what it shows before the time"
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*`])", shows) if s.strip()]
    assert len(sentences) <= 3, f"{number} opens with {len(sentences)} sentences: {sentences}"
    assert "**What you will learn" not in first and "assert" not in first


def path_stops(text):
    """The italic stop names of the 15-minute path section of a README-like text."""
    section = text[text.index("15-minute path") :]
    section = section[: section.index("\n\n", section.index("\n1. "))]  # the numbered list
    section = re.sub(r"\[[^\]]*\]\([^)]*\)", "", section)  # links name notebooks, not stops
    return [" ".join(stop.split()) for stop in re.findall(r"\*([A-Z][^*]+)\*", section)]


def test_the_fifteen_minute_path_is_the_same_everywhere_and_names_real_sections():
    docs = ROOT / "docs" / "index.md"
    nb02 = chapter("02")
    stops = {name: path_stops(text) for name, text in (
        ("README.md", (ROOT / "README.md").read_text()), ("docs/index.md", docs.read_text()),
        ("notebook 02", source(cells(nb02)[0])))}
    assert stops["README.md"] == stops["docs/index.md"] == stops["notebook 02"], stops
    headings = [line for c in cells(nb02, "markdown") for line in source(c).splitlines() if line.startswith("## ")]
    for stop in stops["notebook 02"]:
        assert any(re.sub(r"^## \d+\. ", "", h).startswith(stop) for h in headings), f"no section '{stop}' in 02"
    assert "§" not in "".join(stops["README.md"])


# What Colab has besides the standard library (tests/test_colab.py's simulation preinstalls the same), and mha.
COLAB_MODULES = {"torch", "matplotlib", "numpy", "tqdm", "IPython", "mha"}
FILE_READS = re.compile(r"\bopen\(|\bPath\(|read_text|read_bytes|torch\.load|np\.load|pd\.read_|\.csv\b|\.json\b")


@pytest.mark.parametrize("path", SOLUTIONS, ids=name)
def test_a_solution_imports_only_what_colab_has_and_opens_no_file(path):
    # Why tests/test_colab.py may run the chapters alone in its Colab simulation: a solution with the chapters'
    # install cell, these imports and no file of its own runs in Colab wherever it runs under strict nbval.
    code = "\n".join(source(c) for c in cells(path, "code"))
    imported = {m.split(".")[0] for m in re.findall(r"^\s*(?:import|from)\s+([\w.]+)", code, re.M)}
    assert imported - COLAB_MODULES - set(sys.stdlib_module_names) == set()
    assert not FILE_READS.findall(code)
    assert source(cells(path, "code")[0]) == source(cells(ROOT / "notebooks" / path.name.replace("_solutions", ""),
                                                          "code")[0])  # the chapter's install cell
