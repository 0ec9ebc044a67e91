"""Helpers for the agent tests: a temporary host root and tiny real shared objects built with gcc."""
from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

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


def build_lib(d: Path, name: str, marker: str, version: int) -> Path:
    src = d / f"{name}.c"
    src.write_text(_LIB_C)
    out = d / name
    subprocess.run(["gcc", "-shared", "-fPIC", f"-DMARKER={json.dumps(marker)}", f"-DVERSION={version}", "-o", str(out),
                    str(src)], check=True, capture_output=True)
    return out
