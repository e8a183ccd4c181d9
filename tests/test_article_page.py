"""The site's "Part 6 in one page" (docs/article.md) cannot rot: its code is the article's, every test it names
exists, every notebook section it names is there, and its table covers each claim of the article.

The build checks the same links as it fills them in (docs/_ext/course.py fails on a missing test or section); this
checks them in a second, without building the site.
"""

import ast
import json
import re
from pathlib import Path

from test_article import ARTICLE_CODE

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "article.md").read_text(encoding="utf-8")
TEST_REF = re.compile(r"\[\[test:([\w/.]+)::(\w+)\]\]")
SECTION_REF = re.compile(r"\[\[nb:(\w+)#([^\]]+)\]\]")


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def missing_tests(text: str) -> list[str]:
    """The ``[[test:PATH::NAME]]`` references of ``text`` whose PATH does not define a test NAME."""
    missing = []
    for path, name in TEST_REF.findall(text):
        file = ROOT / path
        if not file.is_file() or name not in defined_tests(file):
            missing.append(f"{path}::{name}")
    return missing


def headings(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.findall(r"^#{2,3} +(.+?) *$", text, flags=re.M)


def claim_rows() -> list[list[str]]:
    table = PAGE[PAGE.index("| The article says |"):].split("\n\n")[0].splitlines()[2:]
    return [[c.strip() for c in row.strip().strip("|").split(" | ")] for row in table]


def test_every_test_the_page_names_exists():
    named = TEST_REF.findall(PAGE)
    assert len(named) >= 10, named
    assert missing_tests(PAGE) == []


def test_every_notebook_section_the_page_names_is_one_heading_of_a_notebook():
    named = SECTION_REF.findall(PAGE)
    assert len(named) >= 8, named
    for slug, words in named:
        (path,) = [p for p in (ROOT / "notebooks").glob("*.ipynb") if slug in p.stem]
        found = [h for h in headings(path) if words.lower() in h.lower()]
        assert len(found) == 1, (path.name, words, found)


def test_the_page_prints_the_articles_code_as_printed():
    blocks = re.findall(r"```python\n(.*?)\n```", PAGE, re.S)
    assert blocks == [ARTICLE_CODE]


def test_each_claim_of_the_article_has_a_row_with_a_notebook_section_and_a_test():
    rows = claim_rows()
    for claim, shown, checked in rows:
        assert SECTION_REF.search(shown), f"no notebook section for: {claim}"
        assert TEST_REF.search(checked), f"no test for: {claim}"
    claims = " ".join(claim for claim, _, _ in rows)
    # The article's claims, as GUIDE.md lists them.
    for words in ("in parallel", "d_k = d_model / h", "specialise", "nn.Linear(d_model, 3 * d_model)", "(B, h, T, d_k)",
                  "whole embedding", "x (2, 6, 32)", "y (2, 6, 32)", "(2, 4, 6, 6)", "4,096", "one head or four",
                  "W_O"):
        assert words in claims, f"the table has no row for the article's claim {words!r}"


def test_parts_5_and_7_are_described_where_the_page_and_the_readme_name_them():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_lines = readme.split("\n\n")[1]
    assert "Part 5 was\nscaled dot-product attention" in first_lines
    assert "Part 7, positional encoding, teaches attention about word order" in first_lines
    assert "[Part 6 in one page](https://transformer-on-ramp.github.io/mha/article.html)" in first_lines
    assert "**Before it, Part 5: scaled dot-product attention.**" in PAGE
    assert '**After it, Part 7: positional encoding, "teaching attention about word order".**' in PAGE


def test_the_readme_lists_the_notebooks_in_three_tiers():
    """Issue 29: the lesson (the article's companion), the evidence, and going further, in that order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    notebooks = readme[readme.index("## The notebooks"):].split("\n## ")[0]
    parts = re.split(r"^### ", notebooks, flags=re.M)[1:]
    assert [p.splitlines()[0].split(":")[0] for p in parts] == ["The lesson", "The evidence", "Going further"]
    numbers = [re.findall(r"^\| (\d\d) \|", p, flags=re.M) for p in parts]
    assert numbers == [["02"], ["03", "05", "06"], ["01", "04", "07", "08"]], numbers
