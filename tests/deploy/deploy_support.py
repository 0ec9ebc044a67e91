"""Helpers for the deploy tests (a unique module name: test folders share one sys.path)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# Not root: the login user owns the test library dirs, so node commands run without sudo.
IS_ROOT = os.geteuid() == 0
NO_SUDO: list[str] = [] if IS_ROOT else ["--no-sudo"]


def sha(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def assert_whole(live: Path, *allowed: Path) -> Path:
    """The live file is byte-identical to one of `allowed`; returns which."""
    data = live.read_bytes()
    for a in allowed:
        if data == a.read_bytes():
            return a
    raise AssertionError(f"{live} is neither of {[str(a) for a in allowed]} (size {len(data)})")


def make_node(root: Path, lib: Path | None, name: str = "libvgpu.so", target: str = "usr/local/vgpu") -> Path:
    """A fake node root with `lib` as its live library; returns the library dir."""
    d = root / target
    d.mkdir(parents=True, exist_ok=True)
    if lib is not None:
        shutil.copyfile(lib, d / name)
        (d / name).chmod(0o644)
    return d


def leftovers(d: Path) -> list[str]:
    """Temp files a swap must never leave behind in the library dir or its staging area."""
    names = [p.name for p in d.iterdir() if "vgpu-patch-tmp" in p.name]
    staging = d / ".vgpu-patch" / "staging"
    if staging.exists():
        names += [p.name for p in staging.iterdir()]
    backups = d / ".vgpu-patch" / "backups"
    if backups.exists():
        names += [p.name for p in backups.iterdir() if p.name.startswith(".")]
    return names


def leftovers_after_exit(d: Path, timeout: float = 10.0) -> list[str]:
    """leftovers(d) once the node's script is done: over a cut link it runs on, orphaned, for a few ms
    (it ignores HUP), and removes its own temp files when its sha256 check fails. Polled, bounded."""
    import time

    deadline = time.monotonic() + timeout
    while leftovers(d) and time.monotonic() < deadline:
        time.sleep(0.02)
    return leftovers(d)


_LIB_SRC = r"""
#include <stddef.h>
__attribute__((used)) static const char marker[] = "%(marker)s";
__attribute__((used)) static const unsigned char pad[%(pad)d] = {%(fill)d};
int vgpu_test_version(void) { return %(version)d; }
unsigned long vgpu_test_sum(void)
{ unsigned long s = 0; for (size_t i = 0; i < sizeof pad; i++) s += pad[i]; return s + (unsigned long)marker[0]; }
"""


def build_lib(out: Path, version: int, *, ours: bool = True, pad: int = 256 * 1024, cc: str = "gcc") -> Path:
    """A real shared object: `ours` embeds `vgpu-patch-shim 0.<version>.0` like our shim does."""
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not found")
    marker = f"vgpu-patch-shim 0.{version}.0" if ours else f"vendor-vgpu build {version}"
    src = out.with_suffix(".c")
    src.write_text(_LIB_SRC % {"marker": marker, "pad": pad, "fill": version % 250 + 1, "version": version})
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out
