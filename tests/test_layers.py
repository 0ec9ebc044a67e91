"""The package's modules import one way only, and its top level holds only the CLI's face.

The import graph is read from the source with `ast`: every import counts, at module level, inside a
function, under `if TYPE_CHECKING:` and in the `from . import x` form (an edge to the module `x` when it is
one, else to the package); `importlib.import_module(f"vgpu_patch.commands.{name}")` (the CLI's lazy command
table) is an edge to every module its constant prefix names. A circle of imports between two or more
modules fails the test and is named.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "vgpu_patch"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
# the face: the package itself and the command line. Everything else lives in a package, down to the floor every
# layer uses: report/ (errors and their exit codes, the one -v level).
TOP_LEVEL = {"__init__.py", "cli.py"}
# the floors of docs/architecture.md, top first: each package (or top-level module) imports only from below it
FLOORS = ["cli", "commands", "agent", "k8s", "deploy", "gpubench", "shim_build", "elf", "transport", "release",
          "shim", "report", PACKAGE]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name `from <module> import ...` refers to, inside `importer`."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _calls(node: ast.Call, name: str) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == name) or (isinstance(f, ast.Name) and f.id == name)


def _constant_prefix(arg: ast.expr) -> str:
    """`"a.b"` -> "a.b"; `f"a.b.{x}"` -> "a.b." (what is known before the first placeholder)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        first = arg.values[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    return ""


def import_graph() -> dict[str, set[str]]:
    """Module -> the vgpu_patch modules it imports (its own package's `__init__` not counted)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Call) and _calls(node, "import_module") and node.args:
                prefix = _constant_prefix(node.args[0])
                targets = [m for m in mods if prefix and (m == prefix or m.startswith(prefix.rstrip(".") + "."))]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                where = _resolve(name, is_package, node)
                targets = [f"{where}.{a.name}" if f"{where}.{a.name}" in mods else where for a in node.names]
            for target in targets:
                while target and target not in mods:  # `import vgpu_patch.x.y` names a module; trim attributes
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_every_form_of_import() -> None:
    g = import_graph()
    assert "vgpu_patch.report.errors" in g["vgpu_patch.cli"]  # from .report.errors import ...
    assert "vgpu_patch.report.verbosity" in g["vgpu_patch.transport.base"]  # from ..report import verbosity
    assert "vgpu_patch.deploy.script" in g["vgpu_patch.deploy.ops"]  # inside a function
    assert "vgpu_patch.commands.demo" in g["vgpu_patch.cli"]  # importlib.import_module(f"vgpu_patch.commands.{x}")


def test_find_cycle_names_the_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_back_into_a_module_that_imports_it() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def _floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def test_every_package_imports_only_from_the_floors_below_it() -> None:
    g = import_graph()
    assert {_floor(m) for m in g} == set(FLOORS), "a new package: give it its floor in FLOORS and the docs"
    upward = sorted(f"{a} -> {b}" for a, bs in g.items() for b in bs
                    if FLOORS.index(_floor(b)) < FLOORS.index(_floor(a)))
    assert not upward, f"imports from a floor above: {upward}"


def test_the_top_level_holds_only_the_face_and_the_floor() -> None:
    loose = {p.name for p in ROOT.glob("*.py")} - TOP_LEVEL
    assert not loose, f"modules at the top of {PACKAGE}/ that belong in a package: {sorted(loose)}"
