"""Top-level pytest configuration: the `gpu` marker runs only with --gpu (never in CI), and the builds
every folder shares (the shim, the fake driver), each made once per test session."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

FAKE_SRC = Path(__file__).resolve().parent / "fake_driver"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu", action="store_true", help="run tests that need a real NVIDIA GPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--gpu"):
        return
    skip = pytest.mark.skip(reason="needs a real GPU: run with --gpu on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def build_fake_driver(out: Path) -> Path:
    """tests/fake_driver/*.c -> out/libcuda.so.1 + out/libnvidia-ml.so.1 (SONAMEs set)."""
    from vgpu_patch.shim_build.build import header_dir

    out.mkdir(parents=True, exist_ok=True)
    common = ["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra", "-Werror",
              f"-I{header_dir()}", "-Wl,-Bsymbolic"]
    for src, soname in (("fake_cuda.c", "libcuda.so.1"), ("fake_nvml.c", "libnvidia-ml.so.1")):
        subprocess.run(common + [f"-Wl,-soname,{soname}", str(FAKE_SRC / src), "-o", str(out / soname), "-lpthread"],
                       check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake CUDA driver and NVML (tests/fake_driver), built once for every folder."""
    return build_fake_driver(tmp_path_factory.mktemp("fake-driver"))


@pytest.fixture(scope="session")
def shim_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real shim, built once for every folder (or VGPU_TEST_SHIM: another build, e.g. zig or a floor)."""
    prebuilt = os.environ.get("VGPU_TEST_SHIM")
    if prebuilt:
        return Path(prebuilt).resolve()
    from vgpu_patch.shim_build.build import build_shim

    # native gcc, no glibc floor: the fastest build; floors and zig are the build tests' business
    return build_shim(tmp_path_factory.mktemp("shim"), compiler="gcc", glibc=None).library
