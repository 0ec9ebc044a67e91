"""Small helpers for the deploy tests."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


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
