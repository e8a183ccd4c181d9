"""Sphinx configuration for the course website.

Build (from the repository root):
    python -m sphinx -W --keep-going -b html -d docs/_build/doctrees docs docs/_build/html
docs/_build/html is then exactly what gets published (the doctrees live beside it, not in it).
The notebooks are rendered with the outputs they were committed with (nbval checks those); nothing is
executed. docs/_ext/course.py finds the notebooks and fills in the generated parts of the pages (CONTRIBUTING.md,
"The website", says why each is generated);
docs/_ext/onsite.py keeps the notebooks' links on the site and makes their figures open at full size;
docs/_ext/sitecheck.py checks every link and image of the result.
"""

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]  # the mha package (for autodoc) and this site's extensions

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
REPO_URL = PROJECT["urls"]["Homepage"]  # the one place the repository URL lives

project = "mha: multi-head attention, written to be read"
author = "the Transformer on-ramp"
copyright = "the Transformer on-ramp authors, MIT license"
import mha  # noqa: E402 (after sys.path points at the repository)

release = version = mha.__version__  # the one place the version lives (pyproject reads it too)

extensions = ["myst_nb", "sphinx_design", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "course", "onsite", "mathml",
              "sitecheck"]
exclude_patterns = ["_build", "_generated", "**.ipynb_checkpoints", "head_view_demo.py"]

# Notebooks: show the committed outputs, never re-execute.
nb_execution_mode = "off"
nb_merge_streams = True
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "dollarmath", "substitution"]
# {{ repo }} and {{ version }} in the pages (in a code block: a ```{parsed-literal} block, where they are replaced).
myst_substitutions = {"repo": REPO_URL, "version": version}
# [Open in Colab](colab:notebooks/NAME.ipynb): a notebook of the repository's main branch, in Colab.
COLAB = "https://colab.research.google.com/github/" + REPO_URL.removeprefix("https://github.com/")
myst_url_schemes = {"http": None, "https": None, "mailto": None, "colab": COLAB + "/blob/main/{{path}}"}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_book_theme"
html_title = "mha · multi-head attention"
html_static_path = ["_static"]
html_css_files = ["course.css"]
# Only what a reader needs is published: no copies of the page sources (the notebooks are one click away, in the
# repository and in Colab). docs/_ext/course.py also removes the theme's source maps from the build.
html_copy_source = False
html_show_sourcelink = False
# One search box, the header's: the theme would put a second one at the top of the sidebar. On notebook pages the
# sections are listed in the left sidebar instead of a right-hand one, so code and figures get the width.
_NAV = ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]
html_sidebars = {"*": _NAV, "notebooks/**": [*_NAV, "page-toc.html"]}  # "*": the pages outside notebooks/
html_favicon = "_static/favicon.svg"  # without one, browsers ask the server for /favicon.ico (a 404)
html_context = {"default_mode": "auto"}  # light or dark, as the reader's system is
html_theme_options = {
    "repository_url": REPO_URL,
    "repository_branch": "main",
    "path_to_docs": "",  # pages of notebooks/NAME.ipynb launch notebooks/NAME.ipynb in the repository
    "use_repository_button": True,
    # No launch button: each notebook's own "Open in Colab" badge, under its title, is the page's one way into Colab
    # (docs/_ext/course.py turns the notebooks' other Colab links into links to the site's pages).
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "secondary_sidebar_items": {"*": ["page-toc.html"], "notebooks/**": []},
    "use_download_button": False,  # it offers the page's source, which is not published (html_copy_source)
}
html_last_updated_fmt = None
html_math_renderer = "mathml"  # docs/_ext/mathml.py: MathML made at build time, no MathJax from a CDN
