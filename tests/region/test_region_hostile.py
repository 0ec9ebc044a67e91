"""Issue 11, points 1, 6 and 7 with the real shim over the fake driver: a full filesystem never
kills the process (SIGBUS), hostile or foreign region files are refused with one line and the
limits hold per process (never unlimited, never refuse-everything), and malformed SM limits
fail closed like memory limits."""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
from pathlib import Path

import pytest
from regiontools import lines, result_line, run_tool, shim_child

from vgpu_patch.shim import region as R

MiB = 1 << 20
ENV = {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_DEVICES": "1"}

TWO_ALLOCS = """
shim.cuInit(0)
ctx_on(0)
rcs = [alloc(60 * MiB)[0], alloc(60 * MiB)[0]]
rc, free, total = meminfo()
emit(rcs=rcs, total=total, free=free)
"""


def _run(shim_env, cache: Path, body: str = TWO_ALLOCS, **env: str) -> tuple[dict, str, int]:
    p = shim_child(shim_env, body, cache, **{**ENV, **env})
    res = result_line(p)
    _, err = p.communicate(timeout=60)
    return res, err, p.returncode


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 1 MiB tmpfs: smaller than a region (2 MB)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True)
    if cp.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {cp.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_full_filesystem_never_sigbus(shim_env, tiny_fs: Path) -> None:
    cache = tiny_fs / "cudevshr.cache"
    for _ in range(2):  # the first process and every later one
        res, err, rc = _run(shim_env, cache)
        assert rc == 0, err  # 135 = SIGBUS before the fix
        assert res["rcs"] == [0, 2] and res["total"] == 100 * MiB  # per-process limits, still enforced
        assert err.count("cannot allocate") == 1 and "per process only" in err, err
    assert not cache.exists() or cache.stat().st_size == 0


def test_sparse_vendor_file_on_a_full_filesystem(shim_env, region_tool: Path, tiny_fs: Path) -> None:
    """A vendor writer's sparse (ftruncate) file: we allocate it before use, or refuse it."""
    cache = tiny_fs / "cudevshr.cache"
    head = R.encode(uuids=["GPU-v"], limit=[100 * MiB])
    with open(cache, "wb") as f:
        f.write(head[:4096])
        f.truncate(R.REGION_SIZE)  # sparse: most of it has no backing
    res, err, rc = _run(shim_env, cache)
    assert rc == 0 and res["rcs"] == [0, 2] and "cannot allocate" in err, err
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    cp = run_tool(region_tool, {**env, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache)}, "attach")
    assert lines(cp) == ["attach failed"]


def test_garbage_slot_table_is_refused_not_obeyed(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    buf = bytearray(os.urandom(R.REGION_SIZE))
    buf[:R.REGION_FIELDS["procs"][0]] = R.encode(uuids=["GPU-x"], limit=[100 * MiB])[:R.REGION_FIELDS["procs"][0]]
    cache.write_bytes(bytes(buf))
    os.chmod(cache, 0o600)
    res, err, rc = _run(shim_env, cache)
    assert rc == 0 and res["rcs"] == [0, 2], err  # not "every allocation fails", not unlimited
    refusals = [ln for ln in err.splitlines() if "corrupt" in ln]
    assert len(refusals) == 1 and "per process only" in refusals[0], err


def test_region_of_another_uid_in_a_sticky_directory_is_refused(shim_env, tmp_path: Path) -> None:
    """A sticky directory (a host's /tmp) is where users that share nothing else meet; in a directory of
    the container's own another uid's region is shared (tests/shim/test_container_uids.py)."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    cache = sticky / "cache"
    cache.write_bytes(R.encode(uuids=["GPU-x"], limit=[0]))  # "no limit", from someone else
    os.chown(cache, 12345, 12345)
    res, err, rc = _run(shim_env, cache)
    assert rc == 0 and res["rcs"] == [0, 2] and res["total"] == 100 * MiB
    assert err.count("owned by uid 12345") == 1 and "per process only" in err, err


def test_region_limit_zero_never_lifts_the_env_limit(shim_env, tmp_path: Path) -> None:
    """Our own (or root's, e.g. a vendor's 0666) file that says "no limit": the env's 100m still holds."""
    cache = tmp_path / "cache"
    cache.write_bytes(R.encode(uuids=["GPU-x"], limit=[0]))
    os.chmod(cache, 0o666)
    res, err, rc = _run(shim_env, cache)
    assert rc == 0 and res["rcs"] == [0, 2] and res["total"] == 100 * MiB
    assert "stricter" in err and "never lift" in err, err
    assert R.read_region(cache).used(0) == 0  # it did share the file (and left it clean)


def test_a_region_limit_stricter_than_the_env_still_wins(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_bytes(R.encode(uuids=["GPU-x"], limit=[50 * MiB]))
    os.chmod(cache, 0o600)
    res, err, _ = _run(shim_env, cache)
    assert res["rcs"] == [2, 2] and res["total"] == 50 * MiB and "the region's" in err


def test_a_wrapping_sum_saturates_and_falls_back_to_per_process(shim_env, tmp_path: Path) -> None:
    """A slot turned hostile after we attached (2^64 - 1 MiB used): the sum saturates instead of wrapping
    to something small, and we keep the env limit per process with one warning."""
    cache = tmp_path / "cache"
    body = """
shim.cuInit(0)
ctx_on(0)
emit(first=alloc(10 * MiB)[0])
wait()
emit(rcs=[alloc(40 * MiB)[0], alloc(60 * MiB)[0]])
"""
    cache.write_bytes(R.encode(uuids=["GPU-x"], limit=[100 * MiB], procs=[R.SlotSpec(pid=os.getpid(), used={})]))
    os.chmod(cache, 0o600)
    with open(cache, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:  # this process is the live "peer"
        p = shim_child(shim_env, body, cache, **ENV)
        assert result_line(p)["first"] == 0
        total = R.slot_offset(0) + 8 + R.MEMORY_FIELDS["total"]
        struct.pack_into("<Q", m, total, (1 << 64) - MiB)  # with our 10 MiB: wraps to 9 MiB if unsaturated
        p.stdin.write("\n")
        p.stdin.flush()
        res = result_line(p)
        _, err = p.communicate(timeout=60)
    assert res["rcs"] == [0, 2], err  # 10 + 40 fit our own 100m; 60 more do not
    assert err.count("corrupt") == 1, err


REFUSED = """
init = shim.cuInit(0)
fake.cuInit(0)                     # behind the shim's back, so allocations reach the wrappers
ctx = ffi.new("CUcontext *"); fake.cuDevicePrimaryCtxRetain(ctx, 0); fake.cuCtxSetCurrent(ctx[0])
emit(init=init, alloc=alloc(MiB)[0], fake_allocs=fake.fake_calls(b"cuMemAlloc_v2"))
"""


@pytest.mark.parametrize("var,value", [("CUDA_DEVICE_SM_LIMIT", v) for v in
                                       ["50%", "+50", "50 ", " 50", "5e1", "-1", "50m", "", "0x32"]]
                         + [("CUDA_DEVICE_SM_LIMIT_0", "30 percent")])
def test_malformed_sm_limit_fails_closed(shim_env, tmp_path: Path, var: str, value: str) -> None:
    """As a malformed memory limit does (tests/shim/test_alloc_paths.py): CUDA refused, one line naming it."""
    res, err, _ = _run(shim_env, tmp_path / "cache", REFUSED, **{var: value})
    assert res == {"init": 1, "alloc": 1, "fake_allocs": 0}, err  # never unlimited, never unthrottled
    named = [ln for ln in err.splitlines() if f"invalid {var}='{value}'" in ln]
    assert len(named) == 1 and named[0].startswith("vgpu: ") and named[0].endswith("; fix the pod's limit"), err


@pytest.mark.parametrize("value", ["0", "100", "150", "050", "30"])
def test_well_formed_sm_limits_do_not_fail(shim_env, tmp_path: Path, value: str) -> None:
    res, err, _ = _run(shim_env, tmp_path / "cache", CUDA_DEVICE_SM_LIMIT=value)
    assert res["rcs"] == [0, 2], err


def test_a_hard_link_to_another_file_is_refused_untouched(shim_env, tmp_path: Path) -> None:
    """A file of region size without the magic looks like a region whose creator died mid-way; as a
    second name of some other file (root's, here) it is neither initialised nor used."""
    other = tmp_path / "someone-elses-file"
    other.write_bytes(bytes(R.REGION_SIZE))
    cache = tmp_path / "cache"
    os.link(other, cache)
    res, err, rc = _run(shim_env, cache)
    assert rc == 0 and res["rcs"] == [0, 2] and res["total"] == 100 * MiB, err
    assert err.count("hard link") == 1 and "per process only" in err, err
    assert other.read_bytes() == bytes(R.REGION_SIZE)


def test_a_read_only_region_is_refused(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_bytes(R.encode(uuids=["GPU-x"], limit=[0]))
    os.chmod(cache, 0o400)
    res, err, rc = _run(shim_env, cache)
    assert rc == 0 and res["rcs"] == [0, 2] and res["total"] == 100 * MiB, err
    assert err.count("read-only (mode 400)") == 1 and "per process only" in err, err
