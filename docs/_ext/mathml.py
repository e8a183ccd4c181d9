"""Render the notebooks' LaTeX as MathML when the site is built, so pages need no MathJax.

Sphinx's default math renderer loads MathJax from a CDN, which an offline reader (or a strict content
policy) never gets. Browsers display MathML themselves (MathML Core: Chromium 109+, Firefox, Safari);
latex2mathml converts the TeX in pure Python. A formula it cannot convert is a build warning.
"""

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _mathml(self, node, display):
    latex = node.astext()
    try:
        return convert(latex, display=display)
    except Exception as err:  # latex2mathml raises its own exceptions and plain ones alike
        logger.warning("cannot convert math to MathML (%s): %s", err, latex, location=node)
        return f"<code>{self.encode(latex)}</code>"


def visit_math(self, node):
    self.body.append(_mathml(self, node, "inline"))
    raise nodes.SkipNode


def visit_displaymath(self, node):
    self.body.append(self.starttag(node, "div", CLASS="math notranslate nohighlight"))
    self.body.append(_mathml(self, node, "block"))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_displaymath, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
