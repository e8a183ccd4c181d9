"""Token labels that any picture can show: every string a tokenizer can produce, drawn as written.

Tokens are whatever a tokenizer returns: markup, control characters, right-to-left text, emoji, broken
surrogates, empty strings, a thousand characters, and TeX: ``$``, ``$x$``, ``_``, ``^``, ``\\``. The view's data
keeps them exactly (JSON escapes everything outside ASCII); only what is *drawn* goes through :func:`display_label`,
and every text that matplotlib draws in ``mha.plot`` (tick labels, titles, the static picture's labels) through
:func:`label`, so that a token is never read as mathtext: ``"$x$"`` shows its dollars and ``"$_$"`` no longer
crashes the draw (case C31; matplotlib#20266).
"""

from __future__ import annotations

import re

# Characters XML 1.0 (so SVG) cannot hold, and ones that would draw nothing or move text around:
# C0 controls, DEL, C1 controls, lone surrogates, and the noncharacters U+FFFE and U+FFFF.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _visible(match: re.Match) -> str:
    c = ord(match.group())
    if c < 0x20:
        return chr(0x2400 + c)  # the Control Pictures block: "\n" is drawn as "␊"
    if c == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"  # C1 controls, lone surrogates, noncharacters


def display_label(token: str, limit: int) -> str:
    """``token`` as a picture shows it: control characters as their symbols (``"\\n"`` as ``"␊"``),
    lone surrogates and other characters XML cannot hold as ``\\udc80``-style escapes, and at most
    ``limit`` characters, the last one "…" when it is cut."""
    label = _INVISIBLE.sub(_visible, token)
    return label if len(label) <= limit else label[: limit - 1] + "\u2026"


#: The text property every matplotlib text in ``mha.plot`` is drawn with, beside :func:`label`'s text: no mathtext.
AS_WRITTEN = {"parse_math": False}


def label(token: str, limit: int | None = None) -> str:
    """``token`` as every picture in ``mha.plot`` draws it: control characters made visible and, when ``limit``
    is given, at most that many characters (see :func:`display_label`). matplotlib draws it as written when the
    text is passed with :data:`AS_WRITTEN`: ``ax.set_title(label(name), **AS_WRITTEN)``, ``ax.set_xticks(range(S),
    labels=[label(t) for t in tokens], **AS_WRITTEN)``, ``fig.text(x, y, label(t), **AS_WRITTEN)``."""
    token = str(token)
    return display_label(token, len(token) + 1 if limit is None else limit)


def not_one_string(labels, name: str) -> None:
    """Raise TypeError when ``labels`` is a single string: it would pass as one label per character."""
    if isinstance(labels, str):
        raise TypeError(f"{name} must be a list of strings, got one string {labels[:30]!r}: use .split()?")
