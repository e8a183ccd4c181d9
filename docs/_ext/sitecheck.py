"""Check a built HTML site offline: every internal link and image resolves, and no page loads anything
from outside it.

Sphinx's own linkcheck needs the network; this reads the built files only. As a Sphinx extension it runs
when an HTML build finishes and reports each problem as a warning (so ``-W`` fails the build); it also
runs alone:

    python docs/_ext/sitecheck.py docs/_build/html

Checked, on every page: ``<a href>`` to a file in the site, and its ``#fragment`` when the target is a
page; ``<img src>``, ``<script src>``, ``<link href>`` (stylesheets, icons, preloads), ``<source>``,
``<iframe>`` and similar must be files in the site or ``data:`` URIs. Links to other sites are allowed
(following one is the reader's choice); loading a resource from one is not.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Attributes that make the browser fetch something as soon as the page loads.
RESOURCE_ATTRS = {
    ("img", "src"), ("script", "src"), ("source", "src"), ("iframe", "src"), ("embed", "src"),
    ("video", "src"), ("video", "poster"), ("audio", "src"), ("track", "src"), ("object", "data"),
    ("input", "src"),
}
NAVIGATION_RELS = {"canonical", "next", "prev", "index", "search", "author", "help", "license", "alternate"}


class Page(HTMLParser):
    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[str, str, bool]] = []  # (tag, url, is a resource the page loads)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        if tag == "a" and a.get("href") is not None:
            self.links.append((tag, a["href"], False))
        elif tag == "link" and a.get("href") is not None:
            rels = set((a.get("rel") or "").lower().split())
            self.links.append((tag, a["href"], not rels <= NAVIGATION_RELS))
        for t, name in RESOURCE_ATTRS:
            if t == tag and a.get(name):
                self.links.append((tag, a[name], True))
        if tag in ("img", "source") and a.get("srcset"):
            for part in a["srcset"].split(","):
                if part.strip():
                    self.links.append((tag, part.split()[0], True))

    handle_startendtag = handle_starttag


def site_pages(outdir) -> list[Path]:
    """The site's pages: every .html file except the theme's templates and Sphinx's copies of sources."""
    outdir = Path(outdir)
    return [p for p in sorted(outdir.rglob("*.html")) if p.relative_to(outdir).parts[0] not in ("_static", "_sources")]


def check_site(outdir, pages=None) -> list[str]:
    """Every problem found in the pages under ``outdir``, as 'page: message' lines.

    ``pages``: the pages to check and to accept as link targets; default, every page in ``outdir``. The
    Sphinx build passes the pages it made, so a page left over from an earlier build is no target.
    """
    outdir = Path(outdir).resolve()
    paths = site_pages(outdir) if pages is None else [Path(p).resolve() for p in pages]
    pages = {p: Page(p.read_text(encoding="utf-8", errors="replace")) for p in paths}
    problems = []
    for path, page in pages.items():
        where = path.relative_to(outdir).as_posix()
        for tag, url, resource in page.links:
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme in ("data", "blob"):
                continue
            if scheme in ("mailto", "tel", "javascript"):
                continue
            if scheme or url.startswith("//"):
                if resource:
                    problems.append(f"{where}: <{tag}> loads {url} from outside the site")
                continue
            if not parts.path:  # "#fragment" on this page
                if parts.fragment and parts.fragment not in page.ids and not resource:
                    problems.append(f"{where}: <a> points at #{parts.fragment}, which this page lacks")
                continue
            target = (path.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if outdir not in target.parents and target != outdir:
                problems.append(f"{where}: <{tag}> {url} points outside the site")
            elif not target.is_file():
                problems.append(f"{where}: <{tag}> {url} does not exist")
            elif target.suffix == ".html" and target not in pages and outdir / "_static" not in target.parents:
                problems.append(f"{where}: <{tag}> {url} is not a page of this build (left from an earlier one?)")
            elif parts.fragment and target.suffix == ".html" and target in pages:
                if parts.fragment not in pages[target].ids:
                    problems.append(f"{where}: <{tag}> {url}: {target.name} has no #{parts.fragment}")
    return problems


def _on_build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    outdir = Path(app.outdir)
    pages = [outdir / app.builder.get_target_uri(doc) for doc in sorted(app.env.found_docs)]
    pages += [outdir / f"{name}.html" for name in ("genindex", "search", "py-modindex")]
    for problem in check_site(outdir, [p for p in pages if p.is_file()]):
        logger.warning("site check: %s", problem)


def setup(app):
    app.connect("build-finished", _on_build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    found = check_site(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html")
    print("\n".join(found) or "site check: every internal link and image resolves; nothing loads from outside")
    sys.exit(1 if found else 0)
