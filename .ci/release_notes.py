"""Print CHANGELOG.md's section for a version: the release workflow makes it the GitHub release's notes.

    python .ci/release_notes.py 0.3.0            # the section's text, without its heading
    python .ci/release_notes.py 0.3.0 --check    # and fail unless the release is ready (the release workflow)

With --check it also fails, naming what disagrees, unless the version is mha.__version__ and CITATION.cff's
version, and the section carries a release date instead of "Unreleased".
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section(changelog: str, version: str) -> tuple[str, str]:
    """(the date or 'Unreleased' after the heading, the section's text) for '## [version] - date'."""
    m = re.search(rf"^## \[{re.escape(version)}\] - (.+?)\n(.*?)(?=^## |^\[[^\]]+\]: |\Z)", changelog, re.M | re.S)
    if not m:
        raise SystemExit(f"release_notes.py: CHANGELOG.md has no section '## [{version}] - <date>'")
    return m.group(1).strip(), m.group(2).strip()


def problems(version: str, when: str) -> list[str]:
    found = []
    package = re.search(r'__version__ = "([^"]+)"', (ROOT / "mha" / "__init__.py").read_text()).group(1)
    if package != version:
        found.append(f"mha.__version__ is {package}, not {version}")
    citation = re.search(r'^version: "?([^"\n]+)"?$', (ROOT / "CITATION.cff").read_text(), re.M).group(1)
    if citation != version:
        found.append(f"CITATION.cff's version is {citation}, not {version}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", when):
        found.append(f"CHANGELOG.md's section for {version} is dated {when!r}: give it the release date (YYYY-MM-DD)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="e.g. 0.3.0 (a tag v0.3.0 without its v)")
    parser.add_argument("--check", action="store_true", help="fail unless the version is ready to release")
    args = parser.parse_args(argv)
    when, text = section((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), args.version)
    if args.check:
        found = problems(args.version, when)
        if found:
            print(f"release_notes.py: not ready to release {args.version}: " + "; ".join(found), file=sys.stderr)
            return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
