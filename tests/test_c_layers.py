"""The shim's C calls go one way (docs/architecture.md, "The shim's layers"): every object of c_src is built
with gcc -c and read with nm; a file calling a function another file defines is an arrow between them. The
test fails on any cycle of arrows between files, and on any arrow from a folder to one above it.

Only C files count: driver/trampolines.S is the assembly beneath the C (the pass-throughs and the slot table
vgpu_real that every REAL() reads); its slow path asks driver/resolve.c to fill the slot it jumps through."""
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


def sources() -> list[Path]:
    return sorted(p for p in C_SRC.rglob("*.c") if p.relative_to(C_SRC).parts[0] != "tests")


def layer(rel: str) -> int:
    folder = rel.split("/")[0]
    return -1 if "/" not in rel else LAYERS.index(folder)


def symbols(src: Path, out: Path, includes: list[Path]) -> tuple[set[str], set[str]]:
    obj = out / (str(src.relative_to(C_SRC)).replace("/", "_") + ".o")
    subprocess.run(["gcc", "-c", "-O0", "-fPIC", "-fvisibility=hidden", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                    f"-I{C_SRC}", *(f"-I{d}" for d in includes), str(src), "-o", str(obj)], check=True)
    nm = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout
    defined: set[str] = set()
    used: set[str] = set()
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in DEFINED:
            defined.add(parts[2])
    return defined, used


@pytest.fixture(scope="module")
def arrows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, set[str]]]:
    """caller file -> callee file -> the symbols it uses there (paths relative to c_src)"""
    if not shutil.which("gcc") or not shutil.which("nm"):
        pytest.skip("needs gcc and nm")
    out = tmp_path_factory.mktemp("objs")
    includes = find_header_dirs()
    srcs = sources()
    with ThreadPoolExecutor(max_workers=2) as pool:
        syms = dict(zip([str(s.relative_to(C_SRC)) for s in srcs],
                        pool.map(lambda s: symbols(s, out, includes), srcs)))
    owner = {sym: f for f, (defined, _) in syms.items() for sym in defined}
    graph: dict[str, dict[str, set[str]]] = {f: {} for f in syms}
    for f, (_, used) in syms.items():
        for sym in used:
            if sym in owner and owner[sym] != f:
                graph[f].setdefault(owner[sym], set()).add(sym)
    return graph


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


def test_calls_only_go_down(arrows: dict[str, dict[str, set[str]]]) -> None:
    upward = [f"{a} -> {b} ({', '.join(sorted(syms))})" for a, callees in sorted(arrows.items())
              for b, syms in sorted(callees.items()) if layer(a) > layer(b)]
    assert not upward, "\n".join(upward)


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
