"""What a notebook's page on the site changes from the notebook, so that a reader of the site stays on the site and
can read every figure on a phone.

- ``site_links``: the notebooks link each other with Colab URLs, which work in Colab and in Jupyter; in the copies
  docs/_ext/course.py makes for the build, each such link but the page's own badge becomes a link to the site's page.
- ``enlargeable_figures`` (a Sphinx extension): every figure of a cell's output is a link to itself at full size, so
  that on a phone, where a figure of three panels is shrunk to a third, a tap shows it whole, to zoom into.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path


def site_links(docname: str, text: str, docnames, colab_prefix: str) -> str:
    """A markdown cell's links to notebooks in Colab (URLs that start with ``colab_prefix``, then the notebook's path
    in the repository), as links to their pages on the site (relative to ``docname``,
    a fragment kept), for the notebooks that are pages (``docnames``). A link whose text is an image (the badge,
    ``[![Open In Colab](...)](...)``) stays: it is the page's one way into Colab."""
    pattern = re.compile(r"(\[[^\[\]]*\])\(" + re.escape(colab_prefix) + r"([^)#\s]+)\.ipynb(#[^)\s]*)?\)")

    def local(m: re.Match) -> str:
        target = m.group(2)
        if target not in docnames:  # not a page of this build (a notebook still to come): Colab it stays
            return m.group(0)
        relative = posixpath.relpath(target, posixpath.dirname(docname))
        return f"{m.group(1)}({relative}.ipynb{m.group(3) or ''})"

    return pattern.sub(local, text)


WIDE_FIGURE = 480  # px: a figure at least this wide is shrunk on a phone (a 390 px screen leaves about 358 for it)


def png_width(path: Path) -> int | None:
    head = path.read_bytes()[:24] if path.is_file() else b""
    return int.from_bytes(head[16:20], "big") if head.startswith(b"\x89PNG\r\n\x1a\n") else None


def enlargeable_figures(app, doctree, docname: str) -> None:
    """Each image in a cell's output becomes a link to the image file (what Sphinx does for images given a smaller
    size); one wide enough to be shrunk on a phone also gets the class mha-wide, which course.css labels there."""
    if app.builder.format != "html" or not docname.startswith("notebooks/"):
        return
    from docutils import nodes
    from sphinx.util.osutil import relative_uri

    images = relative_uri(app.builder.get_target_uri(docname), "_images")
    for image in list(doctree.findall(nodes.image)):
        uri = image["uri"]
        in_output = any("cell_output" in n.get("classes", []) for n in _ancestors(image))
        if not in_output or isinstance(image.parent, nodes.reference) or uri not in app.env.images:
            continue
        width = png_width(Path(app.srcdir) / uri)
        link = nodes.reference("", "", refuri=posixpath.join(images, app.env.images[uri][1]),
                               reftitle="The figure at full size", classes=["mha-enlarge"])
        if width and width >= WIDE_FIGURE:
            link["classes"].append("mha-wide")
        image.replace_self(link)
        link.append(image)


def _ancestors(node):
    while node.parent is not None:
        node = node.parent
        yield node


def setup(app):
    app.connect("doctree-resolved", enlargeable_figures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
