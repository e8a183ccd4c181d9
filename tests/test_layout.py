"""The package's layout: what a wheel ships (the subpackages, the head view's JavaScript and CSS), and file sizes."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400  # issue 18: a file a reader can hold in mind


def test_no_source_file_is_over_400_lines():
    files = [p for folder in ("mha", "benchmarks", "docs/_ext") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".js", ".css")]
    files += list((ROOT / "notebooks").glob("*.py"))
    assert len(files) > 20
    lines = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    assert max(lines.values()) > 100  # the count is of real files
    assert not {name: n for name, n in lines.items() if n > MAX_LINES}


def test_a_built_wheel_ships_every_subpackage_and_the_head_view_assets(tmp_path):
    """Build the wheel from a copy of the sources (no build/ left in the checkout), install it into a folder
    of its own, and use it from a directory where the checkout cannot be imported."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "mha", src / "mha", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("mha-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "mha").rglob("__init__.py")}
    assert {"mha/viz", "mha/parallel", "mha/exercises"} <= packages
    assert {f"{package}/__init__.py" for package in packages} <= names
    assert {"mha/viz/head_view.js", "mha/viz/head_view_export.js", "mha/viz/head_view.css"} <= names

    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    code = (
        "import mha, mha.plot, mha.parallel, torch\n"
        f"assert mha.__file__.startswith({str(target)!r}), mha.__file__\n"
        "html = mha.plot.head_view(torch.full((1, 2, 2), 0.5), ['a', 'b']).to_html()\n"
        "assert 'function createView' in html or 'mhaHeadView' in html, html[:300]\n"
        "assert callable(mha.parallel.shard_heads) and callable(mha.parallel.run_on_ranks)\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]
