"""Fixtures for the agent tests: a temporary host root and tiny real shared objects built with gcc."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_LIB_C = """
static const char marker[] __attribute__((used)) = MARKER;
int vgpu_fixture_version(void) { return VERSION; }
"""


@dataclass
class Image:
    """What the DaemonSet image carries: the library and its build manifest."""

    library: Path
    sha256: str


@dataclass
class Host:
    root: Path

    @property
    def libdir(self) -> Path:
        return self.root / "usr" / "local" / "vgpu"

    @property
    def live(self) -> Path:
        return self.libdir / "libvgpu.so"

    @property
    def state(self) -> Path:
        return self.libdir / ".vgpu-patch"

    def history(self) -> list[dict]:
        p = self.state / "history.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(d: Path, name: str, marker: str, version: int) -> Path:
    src = d / f"{name}.c"
    src.write_text(_LIB_C)
    out = d / name
    subprocess.run(["gcc", "-shared", "-fPIC", f"-DMARKER={json.dumps(marker)}", f"-DVERSION={version}", "-o", str(out),
                    str(src)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    d = tmp_path_factory.mktemp("agentlibs")
    return {"vendor": _build(d, "vendor.so", "HAMi-core vendor build", 0),
            "ours": _build(d, "libvgpu.so", "vgpu-patch-shim 0.1.0", 1)}


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
