"""The real shim (cuMemAlloc over the fake driver) sharing one region across real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from regiontools import result_line, shim_child

from vgpu_patch.shim import region as R

MiB = 1 << 20
LIMIT_ENV = {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_DEVICES": "1"}

HOLD_ALLOC = """
shim.cuInit(0)
ctx_on(0)
sizes = [int(s) for s in os.environ["T_SIZES"].split(",")]
rcs = [alloc(s * MiB)[0] for s in sizes]
emit(rcs=rcs, pid=os.getpid())
wait()
rc, free, total = meminfo()
emit(free=free, total=total)
"""


def _hold(shim_env, cache: Path, sizes: str, **extra: str) -> subprocess.Popen:
    return shim_child(shim_env, HOLD_ALLOC, cache, T_SIZES=sizes, **{**LIMIT_ENV, **extra})


def _finish(p: subprocess.Popen) -> tuple[str, str]:
    out, err = p.communicate("\n", timeout=60)
    return out, err


def _show(cache: Path) -> dict:
    cp = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "region", "show", "--json", str(cache)],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_two_processes_share_one_limit(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = _hold(shim_env, cache, "60")
    try:
        assert result_line(a)["rcs"] == [0]
        b = _hold(shim_env, cache, "60,30")
        assert result_line(b)["rcs"] == [2, 0]  # 60 more: CUDA_ERROR_OUT_OF_MEMORY; 30 fits
        doc = _show(cache)
        assert doc["devices"][0]["limit"] == 100 * MiB and doc["devices"][0]["used"] == 90 * MiB
        assert sorted(p["used"][0] for p in doc["procs"]) == [30 * MiB, 60 * MiB]
        b.stdin.write("\n")
        b.stdin.flush()
        mem = result_line(b)
        assert (mem["total"], mem["free"]) == (100 * MiB, 10 * MiB)  # container-wide view
        _finish(b)
    finally:
        _finish(a)
    assert _show(cache)["devices"][0]["used"] == 0  # both exited: slots freed


def test_sigkill_frees_the_dead_process_share(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = _hold(shim_env, cache, "60")
    assert result_line(a)["rcs"] == [0]
    a.kill()
    a.wait()
    assert _show(cache)["devices"][0]["used"] == 60 * MiB  # the monitor still sees it until reaped
    b = _hold(shim_env, cache, "60")
    try:
        assert result_line(b)["rcs"] == [0]
        assert [p["pid"] for p in _show(cache)["procs"]] == [b.pid]
    finally:
        _finish(b)


def test_twenty_shim_processes_start_at_once(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    procs = [_hold(shim_env, cache, "5") for _ in range(20)]
    try:
        assert all(result_line(p)["rcs"] == [0] for p in procs)
        doc = _show(cache)
        assert doc["devices"][0]["used"] == 100 * MiB and len(doc["procs"]) == 20
        late = _hold(shim_env, cache, "1")
        assert result_line(late)["rcs"] == [2]
        _finish(late)
    finally:
        for p in procs:
            _finish(p)


def test_vendor_region_is_honoured_by_the_shim(shim_env, tmp_path: Path) -> None:
    """A region a vendor library left: its limit (not our env's) and its live process's usage count."""
    cache = tmp_path / "cache"
    cache.write_bytes(R.encode(uuids=["GPU-vendor-0"], limit=[100 * MiB], procs=[
        R.SlotSpec(pid=os.getpid(), hostpid=4321, used={0: 80 * MiB})]))
    import mmap

    with open(cache, "r+b") as f:  # the "vendor process" (this one) maps the region, as a live user does
        m = mmap.mmap(f.fileno(), 0)
        p = _hold(shim_env, cache, "30,20", CUDA_DEVICE_MEMORY_LIMIT="100m")
        try:
            assert result_line(p)["rcs"] == [2, 0]
            r = R.read_region(cache)
            assert (r.procs[0].pid, r.procs[0].hostpid, r.procs[0].used[0]) == (os.getpid(), 4321, 80 * MiB)
            assert r.used(0) == 100 * MiB and r.uuids[0] == "GPU-vendor-0"
        finally:
            _finish(p)
            m.close()


def test_env_disagreeing_with_region_warns_and_region_wins(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = _hold(shim_env, cache, "10")
    try:
        result_line(a)
        b = _hold(shim_env, cache, "150", CUDA_DEVICE_MEMORY_LIMIT="1g")
        assert result_line(b)["rcs"] == [2]  # 150 MiB > the region's 100 MiB, whatever b's env says
        b.stdin.write("\n")
        b.stdin.flush()
        assert result_line(b)["total"] == 100 * MiB
        _, err = _finish(b)
        warn = [ln for ln in err.splitlines() if "memory limit" in ln]
        assert len(warn) == 1 and f"env gives {1 << 30} bytes" in warn[0] and f"holds {100 * MiB} bytes" in warn[0]
        assert warn[0].startswith("vgpu: ") and "using the region's" in warn[0]
    finally:
        _finish(a)


def test_unopenable_region_falls_back_to_per_process_limits(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()  # a directory where the file should be: cannot be a region
    p = _hold(shim_env, cache, "60,60")
    _, err = _finish(p)
    assert "memory limits are per process only" in err
    p2 = _hold(shim_env, cache, "60,60")
    assert result_line(p2)["rcs"] == [0, 2]  # the limit still holds inside the process
    _finish(p2)


def test_sm_limit_over_the_fake_driver_passes_launches(shim_env, tmp_path: Path) -> None:
    """The fake driver has no events: the limiter says so once and launches still go through."""
    body = """
shim.cuInit(0)
ctx_on(0)
rcs = [shim.cuLaunchKernel(ffi.NULL, 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL) for _ in range(3)]
emit(rcs=rcs, calls=fake.fake_calls(b"cuLaunchKernel"))
"""
    p = shim_child(shim_env, body, tmp_path / "cache", CUDA_DEVICE_SM_LIMIT="50", FAKE_CUDA_DEVICES="1")
    res = result_line(p)
    _, err = p.communicate(timeout=60)
    assert res == {"rcs": [0, 0, 0], "calls": 3}
    assert err.count("lacks the event entry points") == 1


def test_region_created_before_cuinit_learns_its_devices(shim_env, tmp_path: Path) -> None:
    """NVML's memory query can come first (no cuInit yet): the region is created with the env's
    limits and no device list, which the first allocation after cuInit fills in."""
    cache = tmp_path / "cache"
    body = """
assert shim.nvmlInit_v2() == 0
h = ffi.new("nvmlDevice_t *")
assert shim.nvmlDeviceGetHandleByIndex_v2(0, h) == 0
m = ffi.new("nvmlMemory_t *")
rc = shim.nvmlDeviceGetMemoryInfo(h[0], m)
emit(rc=rc, total=m.total)
wait()
shim.cuInit(0)
ctx_on(0)
emit(rcs=[alloc(10 * MiB)[0]])
wait()
"""
    p = shim_child(shim_env, body, cache, **{**LIMIT_ENV, "FAKE_CUDA_DEVICES": "2"})
    try:
        assert result_line(p) == {"rc": 0, "total": 100 * MiB}
        assert R.read_region(cache).device_num == 0 and R.read_region(cache).limit[0] == 100 * MiB
        p.stdin.write("\n")
        p.stdin.flush()
        assert result_line(p)["rcs"] == [0]
        r = R.read_region(cache)
        assert r.device_num == 2 and r.used(0) == 10 * MiB
    finally:
        _finish(p)


def test_concurrent_threads_in_two_processes_never_overshoot(shim_env, tmp_path: Path) -> None:
    """8 threads x 2 processes race 1 MiB allocations against a 100 MiB limit: exactly 100 succeed."""
    cache = tmp_path / "cache"
    body = """
shim.cuInit(0)
ctx_on(0)
wait()
ok = []
def worker():
    ctx_on(0)
    n = 0
    for _ in range(20):
        if alloc(MiB)[0] == 0:
            n += 1
    ok.append(n)
ts = [threading.Thread(target=worker) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
emit(ok=sum(ok))
wait()
"""
    procs = [shim_child(shim_env, body, cache, **LIMIT_ENV) for _ in range(2)]
    try:
        for p in procs:  # both start racing at once
            p.stdin.write("\n")
            p.stdin.flush()
        total = sum(result_line(p)["ok"] for p in procs)
        assert total == 100
        assert R.read_region(cache).used(0) == 100 * MiB
    finally:
        for p in procs:
            _finish(p)
