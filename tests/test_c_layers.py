"""The shim's C calls go one way (docs/architecture.md, "The shim's layers"): every object of c_src is built
with gcc -c and read with nm; a file calling a function another file defines is an arrow between them. The
test fails on any cycle of arrows between files, and on any arrow from a folder to one above it.

Assembly counts as C does: driver/trampolines.S is assembled and read the same way, so a `call`, `jmp`, `bl`
or `b` to another file's symbol (its slow path's vgpu_slot_resolve) is an arrow from it. The data an assembly
file defines (the slot table vgpu_real that every REAL() reads and resolve.c fills) is a node of its own,
`<file> (data)`, in the same folder: a table calls nothing, so reading it is never part of a cycle."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vgpu_patch.shim_build.headers import find_header_dirs

C_SRC = Path(__file__).resolve().parent.parent / "c_src"
# top to bottom; a folder may call its own files and any folder below it. Files at the top of c_src
# (version.c) stand above every folder. region/ and driver/ do not call each other; limits/ and log/ are
# leaves every floor may use (driver/ checks the limit variables at init and logs).
LAYERS = ["interpose", "limiter", "accounting", "region", "driver", "limits", "log"]
DEFINED = set("TDBRVWGSi")  # nm's letters for a symbol an object defines


DATA = set("DBRVGSbdrgs")  # ... of those, the letters for data (not code)


def sources() -> list[Path]:
    return sorted(p for p in [*C_SRC.rglob("*.c"), *C_SRC.rglob("*.S")] if p.relative_to(C_SRC).parts[0] != "tests")


def layer(rel: str) -> int:
    folder = rel.split("/")[0]
    return -1 if "/" not in rel else LAYERS.index(folder)


Symbols = dict[str, tuple[set[str], set[str]]]  # file -> (what it defines, what it uses)


def symbols(src: Path, out: Path, includes: list[Path]) -> tuple[set[str], set[str], set[str]]:
    """what the object of src defines as code, defines as data, and uses"""
    obj = out / (str(src).replace("/", "_") + ".o")
    std = ["-std=gnu11"] if src.suffix == ".c" else []
    subprocess.run(["gcc", "-c", "-O0", "-fPIC", "-fvisibility=hidden", *std, "-Wall", "-Wextra", "-Werror",
                    f"-I{C_SRC}", *(f"-I{d}" for d in includes), str(src), "-o", str(obj)], check=True)
    nm = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout
    code: set[str] = set()
    data: set[str] = set()
    used: set[str] = set()
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in DEFINED:
            (data if parts[1] in DATA else code).add(parts[2])
    return code, data, used


def file_symbols(rel: str, code: set[str], data: set[str], used: set[str]) -> Symbols:
    """one file's node; an assembly file's data is a node of its own beside it"""
    if not rel.endswith(".S"):
        return {rel: (code | data, used)}
    return {rel: (code, used), f"{rel} (data)": (data, set())}


def graph_of(syms: Symbols) -> dict[str, dict[str, set[str]]]:
    """caller file -> callee file -> the symbols it uses there"""
    owner = {sym: f for f, (defined, _) in syms.items() for sym in defined}
    graph: dict[str, dict[str, set[str]]] = {f: {} for f in syms}
    for f, (_, used) in syms.items():
        for sym in used:
            if sym in owner and owner[sym] != f:
                graph[f].setdefault(owner[sym], set()).add(sym)
    return graph


@pytest.fixture(scope="module")
def shim_symbols(tmp_path_factory: pytest.TempPathFactory) -> Symbols:
    """every file of c_src (paths relative to it)"""
    if not shutil.which("gcc") or not shutil.which("nm"):
        pytest.skip("needs gcc and nm")
    out = tmp_path_factory.mktemp("objs")
    includes = find_header_dirs()
    srcs = sources()
    syms: Symbols = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for src, found in zip(srcs, pool.map(lambda s: symbols(s, out, includes), srcs)):
            syms.update(file_symbols(str(src.relative_to(C_SRC)), *found))
    return syms


@pytest.fixture(scope="module")
def arrows(shim_symbols: Symbols) -> dict[str, dict[str, set[str]]]:
    return graph_of(shim_symbols)


def cycles(graph: dict[str, dict[str, set[str]]]) -> Iterator[list[str]]:
    """one cycle per strongly connected set of files (Tarjan), as its members"""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()

    def visit(v: str) -> Iterator[list[str]]:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                yield from visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                yield sorted(part)

    for v in sorted(graph):
        if v not in index:
            yield from visit(v)


def test_every_folder_is_a_layer() -> None:
    folders = {p.relative_to(C_SRC).parts[0] for p in sources() if len(p.relative_to(C_SRC).parts) > 1}
    assert folders == set(LAYERS)


def test_no_cycle_between_files(arrows: dict[str, dict[str, set[str]]]) -> None:
    found = list(cycles(arrows))
    detail = [" <-> ".join(c) + ": " + "; ".join(f"{a} -> {b} ({', '.join(sorted(arrows[a][b]))})"
                                               for a in c for b in c if b in arrows[a]) for c in found]
    assert not found, "\n".join(detail)


def upward(arrows: dict[str, dict[str, set[str]]]) -> list[str]:
    return [f"{a} -> {b} ({', '.join(sorted(syms))})" for a, callees in sorted(arrows.items())
            for b, syms in sorted(callees.items()) if layer(a) > layer(b)]


def test_calls_only_go_down(arrows: dict[str, dict[str, set[str]]]) -> None:
    up = upward(arrows)
    assert not up, "\n".join(up)


def test_accounting_charging_floor_above_measuring(arrows: dict[str, dict[str, set[str]]]) -> None:
    """accounting/'s charging floor (what may be taken) calls down into the measuring floor (what is held)"""
    charging = {"accounting/charge.c", "accounting/precharge.c", "accounting/pool_charge.c"}
    up = [f"{a} -> {b}" for a in sorted(arrows) if a.startswith("accounting/") and a not in charging
          for b in arrows[a] if b in charging]
    assert not up, "\n".join(up)


def test_the_graph_sees_known_arrows(arrows: dict[str, dict[str, set[str]]]) -> None:
    """the reader works: arrows the shim certainly has are found"""
    assert "vgpu_charge" in arrows["accounting/pool_charge.c"]["accounting/charge.c"]
    assert "accounting/budget.c" in arrows["accounting/charge.c"]
    # the assembly is in the graph: its slow path calls the resolver, the C reads its slot table
    assert arrows["driver/trampolines.S"]["driver/resolve.c"] == {"vgpu_slot_resolve"}
    assert "vgpu_real" in arrows["driver/resolve.c"]["driver/trampolines.S (data)"]


BAD_TRAMPOLINE = """
    .text
    .globl vgpu_bad
vgpu_bad:
#if defined(__x86_64__)
    call vgpu_log
    jmp vgpu_charge
#else
    bl vgpu_log
    b vgpu_charge
#endif
"""


def test_a_trampoline_calling_up_fails(shim_symbols: Symbols, tmp_path: Path) -> None:
    """a crafted driver/ assembly file that calls log/ (below) and jumps into accounting/ (above) is caught"""
    src = tmp_path / "bad.S"
    src.write_text(BAD_TRAMPOLINE)
    syms = {**shim_symbols, **file_symbols("driver/bad.S", *symbols(src, tmp_path, []))}
    assert upward(graph_of(syms)) == ["driver/bad.S -> accounting/charge.c (vgpu_charge)"]
