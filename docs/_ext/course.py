"""The course's pages, generated from the notebooks at build time.

- Copies notebooks/*.ipynb and notebooks/solutions/*.ipynb into docs/notebooks/ (git-ignored), so each
  becomes a page; the Colab badge's image becomes a local copy, so pages load nothing from the internet.
  The notebooks link each other with Colab URLs (they work in Colab and in Jupyter); in the copies, every such
  link but the page's own badge becomes a link to the site's page (docs/_ext/onsite.py).
  Copies of notebooks that no longer exist are removed.
- Fills the placeholders that MyST and sphinx-design cannot (CONTRIBUTING.md, "The website", says why each is kept;
  the repository URL and the version are MyST substitutions, the landing page's cards sphinx-design's):
  ``<!-- mha:api TOPIC -->``         the API reference of one topic (API_TOPICS below): every public name
                                     of mha, mha.plot, mha.parallel and mha.exercises has exactly one;
  ``<!-- mha:exercises -->``         each notebook's exercises section, and the solutions notebooks;
  ``[[nb:SLUG#WORDS]]``              a link to the section whose heading contains WORDS (any case) of the
                                     notebook whose file name contains SLUG: "02 §3, *The split, drawn and
                                     measured*"; no such section fails the build;
  ``[[test:PATH::NAME]]``            ``NAME`` linked to its line in the repository's PATH; a test that is
                                     not defined there fails the build.
- Writes the head view demo (docs/head_view_demo.py) to docs/_generated/.
- Removes the theme's source maps (``*.map``) from the built site: only what a reader needs is published.

Nothing here names a notebook: the series is whatever notebooks/ holds.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

import onsite
from sphinx.application import Sphinx
from sphinx.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
COPIES = DOCS / "notebooks"
GENERATED = DOCS / "_generated"
BADGE_URL = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "/_static/colab-badge.svg"  # a leading "/" is the source folder, for pages at any depth


def notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("."))


def sources() -> dict[str, Path]:
    """docname -> source notebook, for the series and the solutions."""
    found = {f"notebooks/{p.stem}": p for p in notebooks(ROOT / "notebooks")}
    found |= {f"notebooks/solutions/{p.stem}": p for p in notebooks(ROOT / "notebooks" / "solutions")}
    return found


def _write_if_changed(path: Path, data: bytes) -> None:
    """Rewrite only what changed, so Sphinx's incremental builds stay incremental."""
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def colab_prefix() -> str:
    """What every notebook's Colab URL starts with; the notebook's path in the repository follows."""
    return "https://colab.research.google.com/github/" + repo_url().removeprefix("https://github.com/") + "/blob/main/"


def notebook_copy(docname: str, src: Path, docnames) -> bytes:
    nb = json.loads(src.read_text(encoding="utf-8").replace(BADGE_URL, LOCAL_BADGE))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = onsite.site_links(docname, text, docnames, colab_prefix())
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def sync_notebooks(app: Sphinx) -> None:
    wanted = sources()
    for docname, src in wanted.items():
        _write_if_changed(DOCS / f"{docname}.ipynb", notebook_copy(docname, src, wanted))
    if COPIES.exists():
        for stale in COPIES.rglob("*.ipynb"):
            if stale.relative_to(DOCS).with_suffix("").as_posix() not in wanted:
                stale.unlink()
    # Sphinx never deletes the page of a removed source: after a renumbering, a link to an old name would
    # still find the old page in an incremental build. Remove notebook pages that have no source.
    built = Path(app.outdir) / "notebooks"
    if built.exists():
        for stale in built.rglob("*.html"):
            if stale.relative_to(app.outdir).with_suffix("").as_posix() not in wanted:
                stale.unlink()


def write_head_view_demo(app: Sphinx) -> None:
    spec = importlib.util.spec_from_file_location("head_view_demo", DOCS / "head_view_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    view = demo.view()
    _write_if_changed(GENERATED / "head_view_demo.html", view.to_html().encode("utf-8"))
    _write_if_changed(GENERATED / "head_view_demo.png", view.to_png())


# --- what the pages say about the notebooks ---------------------------------------------------------------


def title(path: Path) -> str:
    first = json.loads(path.read_text(encoding="utf-8"))["cells"][0]
    text = "".join(first["source"]).strip()
    if first["cell_type"] != "markdown" or not text.startswith("# "):
        raise ConfigError(f"{path.name}: the first cell must be markdown starting with '# title'")
    return text.splitlines()[0][2:].strip()


def headings(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.findall(r"^#{2,3} +(.+?) *$", text, flags=re.M)


def label(docname: str, path: Path) -> str:
    number = re.match(r"(\d+)_", path.name)
    name = title(path)
    return f"{number.group(1)} · {name}" if number else name


# The API reference, by topic. Names of mha itself are placed here by hand; every public name of mha.plot,
# mha.exercises and mha.parallel (their __all__) goes to that module's topic. A public name of mha with no topic
# fails the build, so the page always covers the whole API.
API_TOPICS = {
    "layer": ["MultiHeadAttention", "count_parameters", "ParameterCount"],
    "function": ["scaled_dot_product_attention"],
    "masks": ["causal_mask", "padding_mask", "as_keep_mask"],
    "efficient": ["GroupedQueryAttention", "KVCache"],
    "heads": ["split_heads", "merge_heads", "project"],
    "interop": ["from_torch", "to_torch", "to_torch_attn_mask", "to_additive_mask"],
    "plotting": "mha.plot",
    "exercises": "mha.exercises",
    "parallel": "mha.parallel",
}


def public_names(module) -> list[str]:
    """A module's __all__, or (a module without one) the functions and classes it defines or re-exports from mha,
    in the order the module lists them."""
    if hasattr(module, "__all__"):
        return [n for n in module.__all__ if not inspect.ismodule(getattr(module, n))]
    return [n for n, obj in vars(module).items() if not n.startswith("_") and (inspect.isfunction(obj) or
            inspect.isclass(obj)) and getattr(obj, "__module__", "").startswith("mha")]


def api_topics() -> dict[str, list[str]]:
    """Topic -> the dotted names it documents."""
    import mha

    topics = {}
    for topic, names in API_TOPICS.items():
        if isinstance(names, str):
            module = importlib.import_module(names)
            topics[topic] = [f"{names}.{n}" for n in public_names(module)]
        else:
            topics[topic] = [f"mha.{n}" for n in names]
    placed = {n for names in API_TOPICS.values() if not isinstance(names, str) for n in names}
    missing = [n for n in public_names(mha) if n not in placed]
    if missing:
        raise ConfigError(f"docs/_ext/course.py: give these public names of mha a topic in API_TOPICS: {missing}")
    return topics


def api_rst(topic: str) -> str:
    if topic not in API_TOPICS:
        raise ConfigError(f"<!-- mha:api {topic} -->: no such topic; the topics are {list(API_TOPICS)}")
    lines = []
    for dotted in api_topics()[topic]:
        module, name = dotted.rsplit(".", 1)
        obj = getattr(importlib.import_module(module), name)
        if inspect.isclass(obj):
            lines.append(f".. autoclass:: {dotted}")
            if not issubclass(obj, tuple):  # a named tuple's members are its fields, which the docstring gives
                # mha's own base classes' members too (GroupedQueryAttention's from MultiHeadAttention), not nn.Module's
                lines += ["   :members:", "   :inherited-members: Module"]
        elif callable(obj):
            lines.append(f".. autofunction:: {dotted}")
        else:  # data: its `#:` comment, from the module that defines it (autodoc would show type(obj)'s docstring)
            lines += [f".. py:data:: {name}", f"   :module: {module}", "", f"   {data_doc(module, name)}"]
        lines.append("")
    return "```{eval-rst}\n" + "\n".join(lines) + "```"


def data_doc(module: str, name: str) -> str:
    """The ``#:`` comment above ``name = ...`` in ``module`` or one of its submodules (a package re-exports it)."""
    import pkgutil

    from sphinx.pycode import ModuleAnalyzer

    package = importlib.import_module(module)
    candidates = [module] + [f"{module}.{m.name}" for m in pkgutil.iter_modules(getattr(package, "__path__", []))]
    for candidate in candidates:
        docs = ModuleAnalyzer.for_module(candidate).find_attr_docs().get(("", name))
        if docs:
            return " ".join(line.strip() for line in docs if line.strip())
    raise ConfigError(f"{module}.{name} is public data without a `#:` comment above its assignment: write one")


def slug_id(heading: str) -> str:
    """The anchor MyST gives a heading (myst_heading_anchors), for links to a notebook's section."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return re.sub(r" ", "-", text)


def exercises_markdown(prefix: str) -> str:
    out, solutions = [], []
    for docname, path in sources().items():
        if docname.startswith("notebooks/solutions/"):
            solutions.append(f"{prefix}{docname}")
            continue
        sections = [h for h in headings(path) if re.search(r"\bexercises?\b", h, flags=re.I)]
        for h in sections:
            out.append(f"- [{label(docname, path)}: {h}]({prefix}{docname}.ipynb#{slug_id(h)})")
    text = "\n".join(out) if out else "The notebooks' exercise sections will be listed here as they are added."
    if solutions:
        text += "\n\n## Solutions\n\n```{toctree}\n:maxdepth: 1\n\n" + "\n".join(solutions) + "\n```"
    else:
        text += "\n\nSolutions notebooks (in `notebooks/solutions/`) will be listed here once they exist."
    return text


def section_link(slug: str, words: str, prefix: str) -> str:
    """A link to the section of notebook SLUG whose heading contains ``words``, labelled with its number and title."""
    for docname, path in sources().items():
        if slug in path.stem and not docname.startswith("notebooks/solutions/"):
            found = [h for h in headings(path) if words.lower() in h.lower()]
            if len(found) != 1:
                raise ConfigError(f"[[nb:{slug}#{words}]]: {path.name} has {len(found)} headings containing "
                                  f"{words!r} (want 1): {found or headings(path)}")
            number = re.match(r"(\d+)_", path.name).group(1)
            section = re.match(r"(\d+)\. +(.*)", found[0])
            where = f"{number} §{section.group(1)}, *{section.group(2)}*" if section else f"{number}, *{found[0]}*"
            return f"[{where}]({prefix}{docname}.ipynb#{slug_id(found[0])})"
    raise ConfigError(f"[[nb:{slug}#{words}]]: no notebook's file name contains {slug!r}")


def line_of_def(path: str, name: str) -> int | None:
    """The line where ``def name`` starts in the repository's file ``path``, or None."""
    import ast

    file = ROOT / path
    if not file.is_file():
        return None
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.lineno
    return None


def named_test_link(path: str, name: str) -> str:
    line = line_of_def(path, name)
    if line is None:
        raise ConfigError(f"[[test:{path}::{name}]]: {path} defines no {name}")
    return f"[`{name}`]({repo_url()}/blob/main/{path}#L{line})"


def repo_url() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Homepage"]


def fill_placeholders(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname.startswith("notebooks/"):
        return
    prefix = "../" * docname.count("/")
    text = source[0]
    text = re.sub(r"<!-- mha:api (\w+) -->", lambda m: api_rst(m.group(1)), text)
    text = text.replace("<!-- mha:exercises -->", exercises_markdown(prefix))
    text = re.sub(r"\[\[nb:(\w+)#([^\]]+)\]\]", lambda m: section_link(m.group(1), m.group(2), prefix), text)
    text = re.sub(r"\[\[test:([\w/.]+)::(\w+)\]\]", lambda m: named_test_link(m.group(1), m.group(2)), text)
    source[0] = text


def remove_source_maps(app: Sphinx, exception) -> None:
    """The theme ships its CSS and JavaScript with source maps: a developer's tool, not the reader's. (And
    Sphinx makes _sources/ even when html_copy_source leaves it empty.)"""
    if exception is None and app.builder.format == "html":
        for path in Path(app.outdir).rglob("*.map"):
            path.unlink()
        sources_dir = Path(app.outdir) / "_sources"
        if sources_dir.is_dir() and not any(sources_dir.iterdir()):
            sources_dir.rmdir()


def always_reread(app, env, added, changed, removed):
    """Pages with generated content depend on files Sphinx does not track (titles, README, new notebooks).

    And when notebooks come or go, every page is rewritten: each page's sidebar lists the notebooks, and
    Sphinx would otherwise leave the unchanged pages linking to the old set.
    """
    notebook_set = sorted(sources())
    previous, env.mha_notebook_set = getattr(env, "mha_notebook_set", None), notebook_set
    if previous is not None and previous != notebook_set:
        return sorted(env.found_docs)
    generated = []
    for docname in env.found_docs:
        if docname.startswith("notebooks/"):
            continue
        text = Path(env.doc2path(docname)).read_text(encoding="utf-8")
        if "<!-- mha:" in text or "[[" in text:  # a placeholder
            generated.append(docname)
    return generated


def setup(app: Sphinx):
    app.connect("builder-inited", sync_notebooks)
    app.connect("builder-inited", write_head_view_demo)
    app.connect("source-read", fill_placeholders)
    app.connect("env-get-outdated", always_reread)
    app.connect("build-finished", remove_source_maps)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

