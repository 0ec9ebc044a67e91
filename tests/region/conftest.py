"""Fixtures for the shared-region tests: a real gcc build of c_src/tests/region/region_tool.c
(the region layer alone, no shim) and helpers to run it as several real processes."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from regiontools import C_SRC
REGION_SOURCES = sorted((C_SRC / "region").glob("*.c")) + [C_SRC / "log" / "log.c"] + sorted(
    (C_SRC / "limits").glob("*.c")
)
CFLAGS = ["-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", f"-I{C_SRC}"]


def _cc() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler (gcc) on PATH")
    return cc


@pytest.fixture(scope="session")
def region_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The region test driver, built once per session."""
    out = tmp_path_factory.mktemp("region-tool") / "region_tool"
    src = C_SRC / "tests" / "region" / "region_tool.c"
    subprocess.run([_cc(), *CFLAGS, str(src), *map(str, REGION_SOURCES), "-o", str(out), "-lpthread"], check=True)
    return out


@pytest.fixture
def region_env(tmp_path: Path) -> dict[str, str]:
    """A clean environment whose region file lives in this test's tmp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LIBCUDA"))}
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(tmp_path / "cudevshr.cache")
    return env
