"""What a test run may leave in /tmp: nothing. The suite's temporary files live in one directory per run
(pytest's basetemp and $TMPDIR, both under it), removed at the end of the session; what appears elsewhere in
/tmp during the run, or a touched shim default region (/tmp/cudevshr.cache), is reported by name."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT_TMP = Path("/tmp")
DEFAULT_REGION = ROOT_TMP / "cudevshr.cache"  # c_src/region/region.h: VGPU_REGION_DEFAULT_PATH


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass
class Snapshot:
    names: frozenset[str]
    region: tuple[int, int, int] | None
    ignore: set[str] = field(default_factory=set)


def snapshot(root: Path = ROOT_TMP) -> Snapshot:
    return Snapshot(frozenset(os.listdir(root)), _stat_key(root / DEFAULT_REGION.name))


def left_behind(before: Snapshot, root: Path = ROOT_TMP) -> list[str]:
    """Names that appeared in `root` since `before` (less those ignored), and the default region if touched."""
    now = snapshot(root)
    left = sorted(str(root / n) for n in now.names - before.names - before.ignore)
    if now.region != before.region and now.region is not None and str(root / DEFAULT_REGION.name) not in left:
        left.append(f"{root / DEFAULT_REGION.name} (modified)")
    return left


def make_run_dir() -> Path:
    """One directory for the whole run (a short name: sshd and ssh-agent sockets live under it), in $TMPDIR: a run
    nested in another (tests/test_collection.py) stays inside the outer one's."""
    return Path(tempfile.mkdtemp(prefix="vgpu-t-"))


def remove_run_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # a read-only directory a test left: make it writable, then try again
        for d, dirs, _files in os.walk(path):
            for name in dirs:
                with_write = Path(d) / name
                if not with_write.is_symlink():
                    with_write.chmod(0o700)
        shutil.rmtree(path, ignore_errors=True)
