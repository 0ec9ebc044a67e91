"""Fixtures for the agent tests: a temporary host root and tiny real shared objects built with gcc."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from agent_helpers import Host, Image, build_lib, sha


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    d = tmp_path_factory.mktemp("agentlibs")
    return {"vendor": build_lib(d, "vendor.so", "HAMi-core vendor build", 0),
            "ours": build_lib(d, "libvgpu.so", "vgpu-patch-shim 0.1.0", 1)}


@pytest.fixture
def image(built: dict[str, Path], tmp_path: Path) -> Image:
    """/opt/vgpu-patch of the image: libvgpu.so plus libvgpu.so.json (the build manifest)."""
    d = tmp_path / "image"
    d.mkdir()
    lib = d / "libvgpu.so"
    shutil.copy(built["ours"], lib)
    (d / "libvgpu.so.json").write_text(json.dumps({"schema": 1, "sha256": sha(lib)}) + "\n")
    return Image(lib, sha(lib))


@pytest.fixture
def vendor(built: dict[str, Path]) -> Path:
    return built["vendor"]


@pytest.fixture
def host(tmp_path: Path, vendor: Path) -> Host:
    """A host root whose /usr/local/vgpu holds the vendor's libvgpu.so, as HAMi leaves it."""
    h = Host(tmp_path / "host")
    h.libdir.mkdir(parents=True)
    shutil.copy(vendor, h.live)
    return h


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "watch(kind, interval): how the `running` agent fixture watches")
