"""Fake node roots and tiny marked libraries, shared by the agent and Ansible tests.

A module with a unique name at tests/ (which pytest puts on sys.path), so every test folder can import it.
"""
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


def sha(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def build_marked_lib(out: Path, marker: str, version: int) -> Path:
    """A real shared object built with gcc that embeds `marker` (e.g. `vgpu-patch-shim 0.1.0`)."""
    src = out.with_name(out.name + ".c")
    src.write_text(_LIB_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-DMARKER={json.dumps(marker)}", f"-DVERSION={version}",
                    "-o", str(out), str(src)], check=True, capture_output=True)
    return out


@dataclass(eq=False)  # identity: nodes are dict keys in the fleet tests
class NodeRoot:
    """A node's filesystem under `root`, laid out as docs/node-state.md describes."""

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
