"""What the project claims (Python and torch versions, the ways in, the checks) is what CI runs; the package as released
(sdist and wheel, built, checked, and installed alone with torch); and the release's version, citation and changelog.
"""

import ast
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
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
GUIDE = (ROOT / "CONTRIBUTING.md").read_text()
REPO = PYPROJECT["project"]["urls"]["Homepage"]
OLDEST = tuple(int(n) for n in re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"]).groups())
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "mha" / "__init__.py").read_text()).group(1)
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def bash_blocks(text: str, heading: str) -> list[str]:
    """The bash blocks of one '## heading' section."""
    start = text.index(f"\n## {heading}\n")
    section = text[start : text.find("\n## ", start + 1) % (len(text) + 1)]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def steps(block: str) -> list[str]:
    assert all(line.rstrip().endswith("&&") for line in block.splitlines()[:-1])  # one command, pasted whole
    return [s.strip() for s in " ".join(block.splitlines()).split("&&")]


def make(*args) -> list[str]:
    """What ``make -n ARGS`` would run (the interpreter named python), one command a line."""
    r = subprocess.run(["make", "-n", "-s", "PYTHON=python", *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_python_claims_agree():
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{OLDEST[0]}{OLDEST[1]}"
    assert f"Python {OLDEST[0]}.{OLDEST[1]} or newer" in README and f"Python {OLDEST[0]}.{OLDEST[1]} or newer" in GUIDE
    assert f"the {OLDEST[0]}.{OLDEST[1]} grammar" in GUIDE
    assert OLDEST <= (3, 11) <= (3, 12)  # CI's Python (checked again at run time by .ci/run) and Colab's
    # The GitHub workflow runs the unit tests on the other versions the classifiers claim.
    classifiers = PYPROJECT["project"]["classifiers"]
    claimed = [c.rsplit(":: ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)]
    tested = re.search(r"python-version: \[(.*?)\]", (ROOT / ".github" / "workflows" / "ci.yml").read_text()).group(1)
    assert sorted([*re.findall(r'"(3\.\d+)"', tested), "3.11"]) == sorted(claimed)


def test_every_file_parses_under_the_oldest_claimed_grammar():
    """Only Python 3.11 runs in .ci/run; this holds the code to the grammar of the oldest Python it claims."""
    transform, errors = TransformerManager().transform_cell, []
    for folder in ("mha", "tests", "benchmarks", "experiments", "notebooks", "docs"):
        files = [(p, p.read_text()) for p in sorted((ROOT / folder).rglob("*.py"))]
        for path in sorted((ROOT / folder).glob("*.ipynb")):  # the notebooks' code, IPython magics made Python
            code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
            files += [(f"{path}, cell {i}", transform("".join(c["source"]))) for i, c in enumerate(code)]
        for name, text in files:
            try:
                ast.parse(text, str(name), feature_version=OLDEST)
            except SyntaxError as err:
                errors.append(f"{name}:{err.lineno}: {err.msg}")
    assert not errors, "\n".join(errors)


def test_torch_floor_is_stated_and_is_what_make_floor_installs():
    (spec,) = [d for d in PYPROJECT["project"]["dependencies"] if re.match(r"torch\b", d)]
    floor = re.fullmatch(r"torch>=(\d+\.\d+)", spec.replace(" ", "")).group(1)
    assert f"the oldest torch that `pyproject.toml` allows, {floor}.0" in GUIDE
    assert f'.venv-floor/bin/pip install -q "torch=={floor}.0"' in make("floor")


def test_the_readme_ways_in_are_the_commands_ci_runs():
    notebooks, library, tests = bash_blocks(README, "Set up")
    assert steps(notebooks)[:5] == [f"git clone {REPO}", "cd mha", "python3 -m venv .venv", ". .venv/bin/activate",
                                    CPU_TORCH]
    assert notebooks.endswith("pip install -r requirements.txt && jupyter lab notebooks")
    assert "jupyter lab notebooks --allow-root" in README
    # No release is on PyPI yet (issue 31): the library's way in is the repository, and the README says why.
    assert steps(library) == [CPU_TORCH, f'pip install "mha @ git+{REPO}"']
    assert "**No release of `mha` is on PyPI yet**" in README and f"`mha=={VERSION}`" in README
    # The test command is `make test`, which CI runs (.ci/run runs `make ci`, and ci needs test), defined once.
    assert steps(tests) == ["python3 -m venv .venv", ". .venv/bin/activate", CPU_TORCH, 'pip install -e ".[test,docs]"',
                            "make test"]
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert ci_run.rstrip().endswith("make ci") and "grep" not in ci_run and "eval" not in ci_run
    ci_needs = re.search(r"^ci: (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert ci_needs[0] == "test"
    assert make("test") == ["python -m pytest --site --nbval --nbval-current-env tests notebooks"]
    # The fast tier, named by the README with the command it runs.
    (fast,) = re.findall(r"`make fast` runs the fast tier instead, .*?\(`([^`]+)`\)", README, re.S)
    assert make("fast") == [fast] == ['python -m pytest -q -m "not slow" tests']
    # Every target the README and CONTRIBUTING quote exists (make -n fails on one that does not).
    quoted = set(re.findall(r"`make (\w+)`", README + GUIDE))
    assert {"fast", "test", "docs", "ci"} <= quoted and all(make(target) for target in quoted)
    assert "git tag v<version>" in GUIDE


def test_readme_is_at_most_1500_words():
    assert len(README.split()) <= 1500


@pytest.mark.slow
def test_readme_python_blocks_run_and_print_what_their_comments_say():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks
    for block in blocks:
        r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
        # Every print's line ends with a comment that is exactly what it prints.
        said = [line.split("  # ", 1)[1] for line in block.splitlines() if line.startswith("print(")]
        assert said and r.stdout.splitlines() == said


# --- the package as released: sdist and wheel, built, checked, and installed alone with torch -----------------------


@pytest.fixture(scope="module")
def dist(request, tmp_path_factory):
    """The sdist and the wheel: those in $MHA_DIST (the release workflow tests what it publishes), or built here
    from the working tree as it is, committed or not (sdist first, then the wheel from the sdist, as a release)."""
    if not request.config.getoption("--package"):
        pytest.skip("builds the package and installs it in a fresh venv (a minute or two): pass --package")
    if os.environ.get("MHA_DIST"):
        out = Path(os.environ["MHA_DIST"])
    else:
        root = tmp_path_factory.mktemp("package")
        checkout, out = root / "checkout", root / "dist"
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.splitlines()
        for rel in listed:
            if (ROOT / rel).is_file():
                (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, checkout / rel)
        r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, checkout],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (sdist,), (wheel,) = sorted(out.glob("mha-*.tar.gz")), sorted(out.glob("mha-*.whl"))
    return sdist, wheel


@pytest.mark.slow
def test_sdist_and_wheel_pass_twine_check_strict(dist):
    r = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist)],
                       capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    assert r.returncode == 0 and r.stdout.count("PASSED") == 2, r.stdout + r.stderr


@pytest.mark.slow
def test_the_wheel_holds_the_package_under_6_mb_and_the_sdist_builds_it_without_tests(dist):
    sdist, wheel = dist
    assert sdist.name == f"mha-{VERSION}.tar.gz" and wheel.name == f"mha-{VERSION}-py3-none-any.whl"
    tracked = subprocess.run(["git", "ls-files", "mha"], cwd=ROOT, capture_output=True, text=True, check=True)
    package = {p for p in tracked.stdout.splitlines() if (ROOT / p).is_file()}
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if not n.startswith(f"mha-{VERSION}.dist-info/")}
    assert shipped == package  # every module and data file of the package, and nothing else
    # Notebook 06's text, labels, scores and six models' weights ship in it: issue 32's bound (measured 5.58 MB).
    assert wheel.stat().st_size < 6_000_000, wheel.stat().st_size
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert package <= names and {"LICENSE", "README.md", "CHANGELOG.md", "CITATION.cff", "pyproject.toml"} <= names
    assert not [n for n in names if n.startswith("tests/")]  # they need a checkout (notebooks, docs): not shipped


@pytest.fixture(scope="module")
def alone(dist, tmp_path_factory):
    """A fresh venv with the wheel and what it declares (torch, numpy), nothing else: no matplotlib, no Jupyter."""
    import torch

    root = tmp_path_factory.mktemp("alone")
    python = root / "venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout
    subprocess.run([sys.executable, "-m", "venv", root / "venv"], check=True)
    r = subprocess.run([python, "-m", "pip", "install", "-q", f"torch=={torch.__version__}", dist[1]],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    installed = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                               env=env, check=True).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "mha" in names and not names & {"matplotlib", "tqdm", "ipython", "jupyter"}
    return lambda code, *args: subprocess.run([python, "-c", code, *args], capture_output=True, text=True, env=env,
                                              cwd=root, timeout=300)


@pytest.mark.slow
def test_import_mha_with_only_the_declared_dependencies_is_silent_and_the_walkthrough_runs(alone):
    r = alone("import mha, sys; print(mha.__file__)")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # torch warns "Failed to initialize NumPy" without numpy
    assert "/venv/lib/" in r.stdout  # the installed wheel, not this checkout
    r = alone("import mha.__main__ as m; m.main(['--tokens', '4'])")
    assert r.returncode == 0 and r.stderr == "" and "module == step by step:" in r.stdout, r.stderr


def public_modules() -> list[str]:
    """mha and every module under it whose dotted name has no part starting with '_' (so not mha.__main__)."""
    import mha

    found = pkgutil.walk_packages(mha.__path__, "mha.")
    return ["mha", *sorted(m.name for m in found if not any(p.startswith("_") for p in m.name.split(".")))]


@pytest.mark.slow
def test_every_public_module_imports_with_only_the_declared_dependencies_or_names_the_extra(alone):
    code = ("import importlib, json, sys\nfailed = {}\nfor name in sys.argv[1:]:\n    try:\n"
            "        importlib.import_module(name)\n    except ImportError as e:\n        failed[name] = str(e)\n"
            "print(json.dumps(failed))")
    r = alone(code, *public_modules())
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]  # no warning either
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert {m: e for m, e in json.loads(r.stdout).items() if not set(re.findall(r"mha\[(\w+)\]", e)) & extras} == {}


@pytest.mark.slow
def test_the_head_view_renders_with_only_the_declared_dependencies(alone):
    r = alone("import torch\nfrom mha.plot import head_view\n"
              "w = torch.softmax(torch.randn(2, 3, 3), -1)\n"
              "bundle = head_view(w, ['the', 'cat', 'sat'])._repr_mimebundle_()\n"
              "bundle = bundle[0] if isinstance(bundle, tuple) else bundle\n"
              "print(sorted(bundle), 'mha-hv' in bundle['text/html'])")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    assert "'text/html'" in r.stdout and r.stdout.rstrip().endswith("True"), r.stdout


# --- the release: version, citation, changelog, workflows ---------------------------------------------------------


def release_notes(*args):
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "release_notes.py"), *args], capture_output=True,
                          text=True, timeout=60)


def test_version_citation_and_changelog_agree():
    import yaml

    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["version"] == VERSION
    assert {"message", "title", "authors", "license", "repository-code"} <= set(citation)
    assert citation["repository-code"] == PYPROJECT["project"]["urls"]["Source"]
    notes = release_notes(VERSION)
    assert notes.returncode == 0 and "### " in notes.stdout and "## [" not in notes.stdout, notes.stderr
    # The release workflow's check: ready once the section has a date; while it says Unreleased, refused by name.
    when = re.search(rf"^## \[{re.escape(VERSION)}\] - (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    check = release_notes(VERSION, "--check")
    assert (check.returncode, "is dated 'Unreleased'" in check.stderr) == ((1, True) if when == "Unreleased" else
                                                                           (0, False)), check.stderr


def test_release_check_names_what_disagrees():
    r = release_notes("0.2.0", "--check")  # an older section: the package and the citation are later
    assert r.returncode == 1 and "mha.__version__ is" in r.stderr and "CITATION.cff's version is" in r.stderr
    r = release_notes("9.9.9")
    assert r.returncode != 0 and "no section '## [9.9.9]" in r.stderr


def test_package_index_metadata_has_urls_classifiers_and_absolute_links():
    project = PYPROJECT["project"]
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(project["urls"])
    assert project["authors"] and any(c.startswith("Intended Audience :: Education") for c in project["classifiers"])
    versions = [c.rsplit(":: ", 1)[1] for c in project["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)]
    assert versions[0] == f"{OLDEST[0]}.{OLDEST[1]}"  # the classifiers start where requires-python does
    # The README is the package page's text: every link absolute, so it renders on the index too.
    links = re.findall(r"\]\(([^)\s]+)\)", README) + re.findall(r'(?:href|src)="([^"]+)"', README)
    assert links and not [u for u in links if not u.startswith(("https://", "http://"))]


def test_ci_runs_ci_run_tags_publish_to_pypi_and_issue_templates_exist():
    import yaml

    def load(name):
        data = yaml.safe_load((ROOT / ".github" / name).read_text())
        return {("on" if k is True else k): v for k, v in data.items()}  # YAML 1.1 reads the key `on` as True

    ci = load("workflows/ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"])
    assert [s for s in ci["jobs"]["ci"]["steps"] if s.get("run") == "bash .ci/run"]  # CI is .ci/run
    assert [s for s in ci["jobs"]["pages"]["steps"] if s.get("run") == "make docs"]  # the site it publishes
    release = load("workflows/release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    build = "\n".join(s.get("run", "") for s in release["jobs"]["build"]["steps"])
    for needed in ('release_notes.py "${GITHUB_REF_NAME#v}" --check', "python -m build", "twine check --strict dist/*",
                   "MHA_DIST=dist python -m pytest -q --package tests/test_packaging.py"):
        assert needed in build
    publish = release["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"} and publish["environment"]["name"] == "pypi"
    assert [s for s in publish["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@")]
    assert "--notes-file release-notes.md" in release["jobs"]["github-release"]["steps"][-1]["run"]
    names = {load(f"ISSUE_TEMPLATE/{n}.yml")["name"] for n in ("bug", "confusing-explanation", "exercise-checker")}
    assert names == {"Bug", "Confusing explanation", "Exercise checker wrong"}
