"""Session fixtures: the fake driver and the shim, each built once with the real compiler."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vgpu_patch.build import build_shim, header_dir

from .harness import Env

FAKE_SRC = Path(__file__).resolve().parent.parent / "fake_driver"


def build_fake_driver(out: Path) -> Path:
    """tests/fake_driver/*.c -> out/libcuda.so.1 + out/libnvidia-ml.so.1 (SONAMEs set)."""
    out.mkdir(parents=True, exist_ok=True)
    common = ["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra", "-Werror",
              f"-I{header_dir()}", "-Wl,-Bsymbolic"]
    for src, soname in (("fake_cuda.c", "libcuda.so.1"), ("fake_nvml.c", "libnvidia-ml.so.1")):
        subprocess.run(common + [f"-Wl,-soname,{soname}", str(FAKE_SRC / src), "-o", str(out / soname), "-lpthread"],
                       check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_driver(tmp_path_factory.mktemp("fake-driver"))


@pytest.fixture(scope="session")
def shim_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prebuilt = os.environ.get("VGPU_TEST_SHIM")  # run the scenarios against another build (zig, a floor)
    if prebuilt:
        return Path(prebuilt).resolve()
    # native gcc, no glibc floor: the fastest build; floors and zig are the build tests' business
    return build_shim(tmp_path_factory.mktemp("shim"), compiler="gcc", glibc=None).library


@pytest.fixture()
def env(shim_path: Path, fake_dir: Path, tmp_path: Path) -> Env:
    return Env(shim_path, fake_dir, tmp_path)
