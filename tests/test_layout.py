"""The package's layout: no source file longer than a reader can hold in mind.

What a wheel ships (every subpackage, the head view's JavaScript and CSS) is checked on the built wheel itself in
tests/test_packaging.py (``--package``).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400  # issue 18: a file a reader can hold in mind


def test_no_source_file_is_over_400_lines():
    files = [p for folder in ("mha", "benchmarks", "docs/_ext", "experiments") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".js", ".css")]
    files += list((ROOT / "notebooks").glob("*.py"))
    assert len(files) > 20
    lines = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    assert max(lines.values()) > 100  # the count is of real files
    assert not {name: n for name, n in lines.items() if n > MAX_LINES}
