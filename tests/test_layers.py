"""The package's modules import one way only, and its top level holds only the CLI's face.

The import graph is read from the source with `ast`: every import counts, at module level, inside a
function, under `if TYPE_CHECKING:` and in the `from . import x` form (an edge to the module `x` when it is
one, else to the package). A circle of imports between two or more modules fails the test and is named.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "vgpu_patch"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
# the face: the package itself, the command line and its shared options; the floor every layer uses: one
# errors module (exit codes) and one -v level (verbosity). Everything else lives in a package.
TOP_LEVEL = {"__init__.py", "cli.py", "cli_options.py", "errors.py", "verbosity.py"}


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


def import_graph() -> dict[str, set[str]]:
    """Module -> the vgpu_patch modules it imports (its own package's `__init__` not counted)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
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
    assert "vgpu_patch.errors" in g["vgpu_patch.cli"]  # from .errors import ...
    assert "vgpu_patch.verbosity" in g["vgpu_patch.transport.base"]  # from .. import verbosity
    assert "vgpu_patch.deploy.script" in g["vgpu_patch.deploy.ops"]  # inside a function


def test_find_cycle_names_the_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_back_into_a_module_that_imports_it() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])

