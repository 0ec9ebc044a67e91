"""Every uid of a container draws from its one budget (HAMi #1090, #1112): an `su` shell or a non-root
worker beside the container's first process shares its region, whichever uid created it; a region of
another uid in a sticky directory (a host's /tmp, where users that share nothing else meet) is still
refused. Real processes of real uids (root and 65534, the tests run as root in CI) over the fake driver;
c_src/region/shm.c says why the directory, not the uid, marks the container."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Env

MiB = 1 << 20
NOBODY = 65534
OTHER = 12345  # a third uid of the same container

# one 60 MiB allocation, the container's figures, then hold them until a line arrives on stdin
HOLDER = r"""
#include <stdio.h>
#include <cuda.h>
int main(void)
{
    CUdevice dev; CUcontext ctx; CUdeviceptr a = 0; size_t free_b = 0, total_b = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 3;
    int rc = (int)cuMemAlloc(&a, 60u << 20);
    int mrc = (int)cuMemGetInfo(&free_b, &total_b);
    printf("{\"rc\": %d, \"mrc\": %d, \"free\": %zu, \"total\": %zu}\n", rc, mrc, free_b, total_b);
    fflush(stdout);
    (void)getchar();
    return 0;
}
"""


@pytest.fixture
def world(env: Env) -> Iterator[Path]:
    """A directory every uid can reach (the run's $TMPDIR is 1777 under a 0755 parent, tmp_path is 0700),
    holding copies of the shim, the fake driver and the holder program; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("running processes of other uids needs root")
    d = Path(tempfile.mkdtemp(prefix="uids-"))
    try:
        d.chmod(0o755)
        for f in env.fake_dir.iterdir():
            if f.is_file() and ".so" in f.name:
                shutil.copy(f, d / f.name)
        shutil.copy(env.shim, d / "libvgpu.so")
        shutil.copy(env.compile_c("holder", HOLDER, f"-L{env.fake_dir}", "-l:libcuda.so.1"), d / "holder")
        for f in d.iterdir():
            f.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _container(world: Path, name: str, mode: int, owner: int = 0) -> Path:
    c = world / name
    c.mkdir()
    os.chown(c, owner, owner)
    c.chmod(mode)
    return c


class Holder:
    """The holder program as `uid`, on the region `cache` with a 100m limit; stopped by close()."""

    def __init__(self, world: Path, cache: Path, uid: int, **extra: str) -> None:
        e = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(world / "libvgpu.so"), "LD_LIBRARY_PATH": str(world),
             "CUDA_DEVICE_MEMORY_LIMIT": "100m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache),
             "FAKE_CUDA_DEVICES": "1", "TMPDIR": str(world), **extra}
        kw = {} if uid == 0 else {"user": uid, "group": uid, "extra_groups": []}
        self.proc = subprocess.Popen([str(world / "holder")], env=e, cwd=str(world), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, **kw)  # type: ignore[call-overload]
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.close()
            raise AssertionError(f"holder (uid {uid}) printed nothing: rc={self.proc.returncode} {self.err}")
        self.result = json.loads(line)

    err = ""

    def close(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired, ValueError):
            _, self.err = self.proc.communicate("\n", timeout=30)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()


@contextlib.contextmanager
def holders(world: Path, cache: Path, *uids: int) -> Iterator[list[Holder]]:
    """Start one holder per uid, in order, each holding its allocation while the next starts."""
    started: list[Holder] = []
    try:
        for uid in uids:
            started.append(Holder(world, cache, uid))
        yield started
    finally:
        for h in reversed(started):
            h.close()


def _refused(h: Holder) -> bool:
    r = h.result
    return r["rc"] == 2 and r["mrc"] == 0 and r["total"] == 100 * MiB and r["free"] < 41 * MiB


def test_root_first_then_another_uid_share_one_budget(world: Path) -> None:
    """The issue's case: root holds 60 MiB of a 100m container; uid 65534 is refused 60 MiB more."""
    cache = _container(world, "ctr", 0o755) / "gpu.cache"
    with holders(world, cache, 0, NOBODY) as (root, nobody):
        assert root.result["rc"] == 0, root.result
        assert _refused(nobody), (nobody.result, nobody.proc.stderr)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o666  # whoever reaches the container's directory
    assert "per process" not in root.err + nobody.err, root.err + nobody.err


def test_another_uid_first_then_root_and_a_third_uid_share_it(world: Path) -> None:
    """A non-root first process (the container's user) creates the region; root (`kubectl exec`) and a
    third uid join its budget instead of refusing a file of another owner."""
    cache = _container(world, "ctr", 0o755, owner=NOBODY) / "gpu.cache"
    with holders(world, cache, NOBODY, 0) as (nobody, root):
        assert nobody.result["rc"] == 0 and _refused(root), (nobody.result, root.result)
    assert cache.stat().st_uid == NOBODY
    assert "per process" not in root.err + nobody.err, root.err + nobody.err
    with holders(world, cache, OTHER, 0) as (other, root):  # 65534 is gone: its usage too
        assert other.result["rc"] == 0 and _refused(root), (other.result, root.result)


def test_a_file_of_another_uid_in_a_sticky_directory_is_still_refused(world: Path) -> None:
    """A sticky directory (a host's /tmp) is where unrelated users meet: there the owner check holds,
    and a region we create in it stays 0600."""
    sticky = _container(world, "tmp", 0o1777)
    planted = sticky / "planted.cache"
    with holders(world, planted, NOBODY, 0) as (nobody, root):
        assert nobody.result["rc"] == 0 and root.result["rc"] == 0  # two budgets: root refused the file
    assert "owned by uid 65534" in root.err and "sticky" in root.err and "per process only" in root.err, root.err
    own = sticky / "own.cache"
    with holders(world, own, 0) as (root,):
        assert root.result["rc"] == 0
    assert stat.S_IMODE(own.stat().st_mode) == 0o600


@pytest.mark.parametrize(("dir_mode", "file_mode"), [(0o700, 0o600), (0o750, 0o660), (0o755, 0o666),
                                                     (0o711, 0o666), (0o777, 0o666), (0o1777, 0o600)],
                         ids=lambda m: oct(m))
def test_a_new_region_is_open_to_exactly_who_reaches_its_directory(world: Path, dir_mode: int,
                                                                   file_mode: int) -> None:
    cache = _container(world, "ctr", dir_mode) / "gpu.cache"
    with holders(world, cache, 0) as (root,):
        assert root.result["rc"] == 0
    assert stat.S_IMODE(cache.stat().st_mode) == file_mode


def test_the_other_trust_rules_still_hold_for_another_uids_file(world: Path) -> None:
    """Not a sticky directory, another uid's file: still no symlink, no second name."""
    ctr = _container(world, "ctr", 0o777)
    target = ctr / "real.cache"
    with holders(world, target, NOBODY) as (nobody,):
        assert nobody.result["rc"] == 0
    link = ctr / "link.cache"
    os.symlink(target, link)
    with holders(world, link, 0) as (root,):
        assert root.result["rc"] == 0
    assert "symlink" in root.err and "per process only" in root.err, root.err
    second = ctr / "second.cache"
    os.link(target, second)
    with holders(world, second, 0) as (root,):
        assert root.result["rc"] == 0
    assert "hard link" in root.err and "per process only" in root.err, root.err


def test_bad_input_a_region_path_without_a_name_is_refused_not_faulted(world: Path) -> None:
    ctr = _container(world, "ctr", 0o755)
    with holders(world, Path(str(ctr) + "/"), 0) as (root,):
        assert root.result["rc"] == 0  # per process: a directory is no region
    assert "per process only" in root.err, root.err


@pytest.mark.parametrize("mode", ["0400", "0200", "999", "rw", "01666", "0x1b6"])
def test_bad_input_a_malformed_mode_is_ignored_with_one_line(world: Path, mode: str) -> None:
    """VGPU_SHARED_CACHE_MODE must be octal and keep the owner's read and write: a read-only region (0400) would
    be refused by every process, its creator included, and leave the container on per-process limits."""
    cache = _container(world, "ctr", 0o755) / "gpu.cache"
    h = Holder(world, cache, 0, VGPU_SHARED_CACHE_MODE=mode)
    h.close()
    assert h.result["rc"] == 0 and h.result["total"] == 100 * MiB, h.result
    assert h.err.count("ignoring VGPU_SHARED_CACHE_MODE") == 1 and "per process" not in h.err, h.err
    assert stat.S_IMODE(cache.stat().st_mode) == 0o666  # the directory's rule instead
