"""Helpers for tests/region: run c_src/tests/region/region_tool as real processes."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
C_SRC = ROOT / "c_src"
REGION_SOURCES = sorted((C_SRC / "region").glob("*.c")) + [C_SRC / "log" / "log.c"] + sorted(
    (C_SRC / "limits").glob("*.c")
)
# the limiter as the simulator links it (ops.c, its binding to the real driver, is replaced there)
LIMITER_SOURCES = [C_SRC / "limiter" / n for n in ("limiter.c", "board.c", "bucket.c", "occupancy.c")]
CFLAGS = ["-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", f"-I{C_SRC}"]


def cc() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler (gcc) on PATH")
    return cc


def build_program(d: Path, name: str, source: str, *sources: Path, includes: tuple[str, ...] = ()) -> Path:
    """A test's own C program (source), linked with shim sources, built in d; the executable."""
    (d / f"{name}.c").write_text(source)
    out = d / name
    subprocess.run([cc(), *CFLAGS, *(f"-I{i}" for i in includes), str(d / f"{name}.c"), *map(str, sources), "-o",
                    str(out), "-lpthread"], check=True)
    return out


def run_tool(tool: Path, env: dict[str, str], *steps: str, **env_extra: str) -> subprocess.CompletedProcess:
    """Run the tool to completion; fail the test on a non-zero exit."""
    e = {**env, **env_extra}
    cp = subprocess.run([str(tool), *steps], env=e, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"region_tool {steps} exited {cp.returncode}: {cp.stderr}"
    return cp


class Held:
    """A region_tool process parked at a `wait` step until released (or killed)."""

    def __init__(self, tool: Path, env: dict[str, str], *steps: str, **env_extra: str) -> None:
        self.proc = subprocess.Popen(
            [str(tool), *steps, "wait"], env={**env, **env_extra}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        while True:  # everything up to the wait step has run once "wait" is reached (line-buffered)
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"region_tool died early: {self.proc.stderr.read()}")
            self.lines.append(line.strip())
            if len(self.lines) == len([s for s in steps if _prints(s)]):
                break

    def release(self) -> str:
        out, _err = self.proc.communicate("\n", timeout=30)
        return out

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _prints(step: str) -> bool:
    return not step.startswith(("sleep:", "kill"))


def lines(cp: subprocess.CompletedProcess) -> list[str]:
    return cp.stdout.split("\n")[:-1]


def shim_child(shim_env, body: str, cache: Path, **env_extra: str) -> subprocess.Popen:
    """A Python child that loads the shim over the fake driver (the shim helper's harness prelude),
    runs `body`, and talks over pipes: `wait()` in the body blocks until the test writes a line."""
    import sys
    import textwrap

    from shim.harness import CDEF, PRELUDE

    code = (f"CDEF = {CDEF!r}\n" + PRELUDE + "\ndef wait():\n    sys.stdin.readline()\n"
            + textwrap.dedent(body))
    env = shim_env.base_env({"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache), **env_extra})
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def result_line(proc: subprocess.Popen) -> dict:
    """The next RESULT line a shim child prints."""
    import json

    while True:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited without RESULT: {proc.stderr.read()}")
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
