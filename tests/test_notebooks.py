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
URLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
REPO_URL, SITE_URL = URLS["Homepage"], URLS["Documentation"].rstrip("/")
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
    # index by name, and from the repository while no release is there (tests/test_colab.py runs all three ways).
    assert 'pip_install("mha==' in install and f'pip_install("mha @ git+{REPO_URL}")' in install
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


# Openings (issues 26 and 29): title, badge, the tier line, what the notebook shows in at most three sentences, and
# one time line, the same format everywhere; then the install cell, folded on the website.
TIERS = {"The lesson": ["02"], "The evidence": ["03", "05", "06"], "Going further": ["01", "04", "07", "08"]}
TIER_LINE = re.compile(r"^\*\*Part 6 · (The lesson|The evidence|Going further)\*\*: \S", re.M)
TIME_LINE = re.compile(r"^\*\*Time:\*\* about (\d+) minutes to read, exercises not counted; (\d+) s to run on a "
                       r"CPU\.$", re.M)


def opening(number):
    return source(cells(chapter(number))[0])


@pytest.mark.parametrize("number", CHAPTERS)
def test_opening_names_its_tier_says_in_three_sentences_what_it_shows_then_how_long(number):
    first = opening(number)
    tiers = TIER_LINE.findall(first)
    assert tiers == [next(t for t, numbers in TIERS.items() if number in numbers)], f"{number}: tier line {tiers}"
    assert first.split("\n\n")[2].startswith("**Part 6 · "), f"{number}: the tier line is not right after the badge"
    assert len(TIME_LINE.findall(first)) == 1, f"{number}: no time line, or more than one, in the first cell"
    paragraphs = first[: TIME_LINE.search(first).start()].strip().split("\n\n")
    shows = paragraphs[-1].replace("e.g.", "eg")
    assert not shows.startswith(("**", "#", "[![")), f"{number}: no paragraph saying what it shows before the time"
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*`])", shows) if s.strip()]
    assert len(sentences) <= 3, f"{number} opens with {len(sentences)} sentences: {sentences}"
    assert "**What you will learn" not in first and "assert" not in first


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=name)
def test_the_install_cell_comes_second_and_is_folded_on_the_website(path):
    second = cells(path)[1]
    assert second["cell_type"] == "code" and 'if "google.colab" in sys.modules:' in source(second)
    assert "hide-input" in second["metadata"].get("tags", []), f"{name(path)}: install cell not tagged hide-input"


def test_stated_times_fit_the_series_budget():
    """Every notebook <= 40 minutes; the lesson and the evidence <= 120 together; the whole series <= 200."""
    found = {number: TIME_LINE.search(opening(number)) for number in CHAPTERS}
    assert all(found.values()), f"no time line in {[n for n, m in found.items() if not m]}"
    minutes = {number: int(m.group(1)) for number, m in found.items()}
    assert max(minutes.values()) <= 40, minutes
    assert sum(minutes[n] for n in TIERS["The lesson"] + TIERS["The evidence"]) <= 120, minutes
    assert sum(minutes.values()) <= 200, minutes
    assert minutes["02"] <= 30, minutes  # the lesson itself: the article's companion


def slug(heading):
    """The anchor the website gives a heading (MyST's GitHub-style slug: lower case, spaces as hyphens, only word
    characters and hyphens kept); myst_heading_anchors in docs/conf.py makes it a secondary id of the section."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_the_fifteen_minute_path_links_land_on_the_sections_they_name():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The 15-minute path") :].split("\n## ")[0]
    stops = re.findall(r"^\d\. (.*?)(?=^\d\. |\n\n|\Z)", section, re.M | re.S)
    links = [link for stop in stops for link in re.findall(r"\[([^\]]+)\]\(([^)\s]+)\)", stop)]
    assert len(stops) >= 3 and len(links) >= len(stops), stops
    for text, url in links:
        page, _, anchor = url.partition("#")
        assert page.startswith(f"{SITE_URL}/notebooks/") and page.endswith(".html") and anchor, url
        path = ROOT / "notebooks" / (page.rsplit("/", 1)[1].removesuffix(".html") + ".ipynb")
        headings = [line.lstrip("#").strip() for c in cells(path, "markdown") for line in source(c).splitlines()
                    if re.match(r"#{2,3} ", line)]
        (heading,) = [h for h in headings if slug(h) == anchor] or [None]
        assert heading, f"{url}: no heading of {path.name} has the anchor #{anchor}"
        assert re.sub(r"^\d+\. ", "", heading).lower().startswith(text.strip("*").lower()), (text, heading)
    assert "§" not in section


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
