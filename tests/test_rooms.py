"""Rooms that say what they are (issue 23): the lesson at the top of mha/, tools that import it and never the other
way round, imports that go down the layers and never in a circle, and CONTRIBUTING's "Where things live" table
checked against the tree."""

import ast
import re
from pathlib import Path

import mha

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mha"

# From the bottom up: a module imports only modules of lower layers (a tool package's modules import each other
# too, without a circle). The lesson and what sits beside it never import a tool.
LAYERS = [
    {"mha.values", "mha.precision"},
    {"mha.masks", "mha.heads", "mha.cache", "mha.parameters"},
    {"mha.attention"},
    {"mha.multihead"},
    {"mha.interop"},
    {"mha"},
]
# The tools, also from the bottom up: a tool may use a tool below it (notebook 06's exercise checker scores heads with
# mha.english), never one above it, and the lesson none of them.
TOOL_GROUPS = [
    ("mha.plot",), ("mha.english",), ("mha.exercises",), ("mha.parallel",), ("mha.walkthrough", "mha.__main__"),
]
TOOLS = tuple(name for group in TOOL_GROUPS for name in group)


def tool_group(name: str):
    return next((group for group in TOOL_GROUPS if name.startswith(group)), None)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the file imports, anywhere in it (functions' imports too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `from .x import f`: the module x, not the name f
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found - {name}


def graph(folder: Path, root: Path) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in folder.rglob("*.py")}
    return {name: imports(path, name, set(files)) for name, path in files.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    assert name.startswith(TOOLS), f"{name} is neither in a layer nor a tool: give it a place in LAYERS"
    return len(LAYERS) + TOOL_GROUPS.index(tool_group(name))


def test_mha_imports_no_circle():
    edges = graph(PKG, ROOT)
    assert len(edges) > 30 and any(edges.values())  # the graph is of the real package
    assert circles(edges) == []


def test_imports_go_down_the_layers_and_the_lesson_never_imports_a_tool():
    edges = graph(PKG, ROOT)
    upward = []
    for name, targets in edges.items():
        for target in targets:
            same_tool = tool_group(name) is not None and tool_group(name) == tool_group(target)
            if layer_of(target) >= layer_of(name) and not same_tool:
                upward.append(f"{name} -> {target}")
    assert upward == []
    assert "mha.attention" in edges["mha.multihead"] and "mha.multihead" in edges["mha.parallel.sharding"]


def test_the_checker_of_circles_and_layers_can_fail():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    source = "from .masks import as_keep_mask\nfrom ..plot import head_view\nimport mha.values\n"
    path = ROOT / "tests" / "_rooms_probe.py"
    try:
        path.write_text(source)
        # `..plot` from mha.cache would leave the package: not resolved
        assert imports(path, "mha.cache", {"mha.masks", "mha.plot", "mha.values", "mha"}) == {"mha.masks", "mha.values"}
    finally:
        path.unlink()


def test_benchmarks_import_no_circle():
    edges = graph(ROOT / "benchmarks", ROOT / "benchmarks")
    assert "config" in edges["attention"] and "config" in edges["timing"]
    assert circles(edges) == []


def table() -> list[tuple[list[str], str]]:
    """CONTRIBUTING.md's "Where things live": (paths, kind) per row, each path relative to the repository."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("path", "---"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        folder = names[0].rpartition("/")[0] if "/" in names[0].rstrip("/") else ""
        paths = [names[0]] + [n if "/" in n or not folder else f"{folder}/{n}" for n in names[1:]]  # bare files
        rows.append(([p.rstrip("/") for p in paths], cells[1]))
    return rows


def test_where_things_live_names_every_file_of_mha_once_and_only_paths_that_exist():
    rows = table()
    listed = [p for paths, _ in rows for p in paths]
    assert [p for p in listed if not (ROOT / p).exists()] == []
    under_mha = sorted(p.relative_to(ROOT).as_posix() for p in PKG.iterdir()
                       if p.name not in ("__init__.py", "__pycache__") and (p.suffix == ".py" or p.is_dir()))
    assert sorted(p for p in listed if p.startswith("mha/")) == under_mha
    assert {kind for _, kind in rows} <= {"lesson text", "beside the lesson", "tooling", "data"}


def test_the_lesson_is_what_the_package_docstring_and_the_table_say_and_tools_are_tooling():
    rows = table()
    lesson = {p for paths, kind in rows if kind == "lesson text" for p in paths if p.startswith("mha/")}
    assert lesson == {f"mha/{name}.py" for name in ("attention", "multihead", "heads", "masks", "cache")}
    assert set(re.findall(r"``(mha/\w+\.py)``: ", mha.__doc__)) == lesson
    tools = {p for paths, kind in rows if kind == "tooling" for p in paths if p.startswith("mha/")}
    assert {module_name(ROOT / p if p.endswith(".py") else ROOT / p / "__init__.py") for p in tools} == set(TOOLS)
    assert {module_name(ROOT / p) for p in lesson} == set().union(*LAYERS[:4]) - {
        "mha.values", "mha.precision", "mha.parameters"}
