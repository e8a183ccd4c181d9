"""What the project claims (Python and torch versions, the quick start) is what CI tests, and the reverse."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
REQUIRES = PYPROJECT["project"]["requires-python"]
OLDEST = tuple(int(n) for n in re.fullmatch(r">=(\d+)\.(\d+)", REQUIRES).groups())


def quick_start_blocks():
    section = README[README.index("## Quick start"):README.index("\n## ", README.index("## Quick start") + 1)]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_python_claims_agree():
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{OLDEST[0]}{OLDEST[1]}"
    assert f"Python {OLDEST[0]}.{OLDEST[1]} or newer" in README
    assert f"the {OLDEST[0]}.{OLDEST[1]} grammar" in README
    assert OLDEST <= (3, 11) <= (3, 12)  # CI's Python (checked again at run time by .ci/run) and Colab's


def sources():
    """Every Python file of the project, and every notebook's code (IPython magics turned into Python)."""
    for folder in ("mha", "tests", "benchmarks", "experiments", "notebooks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT), path.read_text()
    transform = TransformerManager().transform_cell
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                yield f"{path.relative_to(ROOT)}, cell {i}", transform("".join(cell["source"]))


def test_every_file_parses_under_the_oldest_claimed_grammar():
    """Only Python 3.11 runs in CI; this holds the code to the grammar of the oldest Python it claims."""
    errors = []
    for name, text in sources():
        try:
            ast.parse(text, str(name), feature_version=OLDEST)
        except SyntaxError as err:
            errors.append(f"{name}:{err.lineno}: {err.msg}")
    assert not errors, "\n".join(errors)


def test_the_grammar_check_can_fail():
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))


def test_torch_floor_is_stated_and_tested():
    (spec,) = [d for d in PYPROJECT["project"]["dependencies"] if re.match(r"torch\b", d)]
    floor = re.fullmatch(r"torch>=(\d+\.\d+)", spec.replace(" ", "")).group(1)
    assert f"the oldest torch that `pyproject.toml` allows, {floor}.0" in README
    # .ci/run reads the floor from pyproject.toml itself and installs exactly that version.
    assert 'tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]' in CI
    assert '.venv-floor/bin/pip install -q "torch==$floor"' in CI


def test_quick_start_creates_a_venv_and_installs_cpu_torch_before_anything_else():
    notebooks, tests = quick_start_blocks()
    for block in (notebooks, tests):
        steps = [s.strip() for s in " ".join(block.splitlines()).split("&&")]
        assert steps[:3] == [
            "python3 -m venv .venv",
            ". .venv/bin/activate",
            "pip install torch --index-url https://download.pytorch.org/whl/cpu",
        ]
        assert all(line.rstrip().endswith("&&") for line in block.splitlines()[:-1])  # one command, pasted whole
    assert notebooks.endswith("pip install -r requirements.txt && jupyter lab notebooks")
    # CI installs its own CPU torch, then runs the last line, found as .ci/run finds it.
    pattern = re.search(r"grep -m1 -E '([^']+)' README.md", CI).group(1)
    ci_lines = [line for line in README.splitlines() if re.search(pattern, line)]
    assert ci_lines == [tests.splitlines()[-1]]
    assert ci_lines[0].endswith("python -m pytest --site --nbval --nbval-current-env tests notebooks")


def test_readme_says_how_to_run_jupyter_as_root_and_to_tag_releases():
    assert "jupyter lab notebooks --allow-root" in README
    assert "git tag v<version>" in README
