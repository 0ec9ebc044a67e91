"""Fixtures for the shared-region tests: a real gcc build of c_src/tests/region/region_tool.c
(the region layer alone, no shim) and helpers to run it as several real processes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from regiontools import C_SRC, CFLAGS, REGION_SOURCES
from regiontools import cc as _cc


@pytest.fixture(scope="session")
def region_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The region test driver, built once per session."""
    out = tmp_path_factory.mktemp("region-tool") / "region_tool"
    src = C_SRC / "tests" / "region" / "region_tool.c"
    subprocess.run([_cc(), *CFLAGS, str(src), *map(str, REGION_SOURCES), "-o", str(out), "-lpthread"], check=True)
    return out


@pytest.fixture(scope="session")
def vendor_double(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vendor-format region writer (c_src/tests/region/vendor_double.c), built once per session."""
    out = tmp_path_factory.mktemp("vendor-double") / "vendor_double"
    src = C_SRC / "tests" / "region" / "vendor_double.c"
    subprocess.run([_cc(), *CFLAGS, str(src), "-o", str(out), "-lpthread"], check=True)
    return out


@pytest.fixture
def region_env(tmp_path: Path) -> dict[str, str]:
    """A clean environment whose region file lives in this test's tmp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LIBCUDA"))}
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(tmp_path / "cudevshr.cache")
    return env


# --- the real shim over the fake driver (the session's builds, tests/conftest.py) --------------------
TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@pytest.fixture
def shim_env(shim_path: Path, fake_dir: Path, tmp_path: Path):
    from shim.harness import Env

    return Env(shim_path, fake_dir, tmp_path)
