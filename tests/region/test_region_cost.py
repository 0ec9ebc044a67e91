"""Issue 11, point 8: what the region and the limiter cost, over the fake driver (bench/limiter_launch.py
and bench/region_attach.py print the same figures beside the build before the change)."""
from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
from pathlib import Path

import pytest
from costtools import (
    attach_storm,
    build_cost_tool,
    build_fake_with_events,
    build_shim_at,
    launch_cost,
    pct,
    start_storm,
)

from vgpu_patch.shim import region as R


@pytest.fixture(scope="module")
def cost(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("cost")
    fake = build_fake_with_events(d / "fake")
    return build_cost_tool(d, fake), build_shim_at(None, d), fake


def test_throttled_launch_makes_at_most_two_extra_driver_calls(cost, tmp_path: Path) -> None:
    tool, shim, fake = cost
    free = launch_cost(tool, shim, fake, tmp_path / "a", 100_000)
    limited = launch_cost(tool, shim, fake, tmp_path / "b", 100_000, CUDA_DEVICE_SM_LIMIT="50")
    assert free["extra_calls"] == 0  # no SM limit: the monitor's part makes no driver call
    assert 0 < limited["extra_calls"] <= 2, limited  # 8 calls per 32 sampled launches = 0.25
    forced = launch_cost(tool, shim, fake, tmp_path / "c", 100_000, CUDA_DEVICE_SM_LIMIT="50",
                         GPU_CORE_UTILIZATION_POLICY="force")
    assert forced["extra_calls"] <= 2


def test_multi_device_process_pays_one_more_call(cost, tmp_path: Path) -> None:
    tool, shim, fake = cost
    two = launch_cost(tool, shim, fake, tmp_path / "a", 50_000, CUDA_DEVICE_SM_LIMIT="50", FAKE_CUDA_DEVICES="2")
    assert 1 <= two["extra_calls"] <= 1.5, two  # cuCtxGetDevice names the device of each launch


def test_twenty_processes_attach_within_5ms_p90(cost, tmp_path: Path) -> None:
    tool, shim, fake = cost
    best = min(pct(attach_storm(tool, shim, fake, tmp_path / f"c{i}"), 0.9) for i in range(3))
    assert best <= 5000, best  # microseconds; 12.8 ms at 68e8a26 on this machine (bench/region_attach.py)


def test_sixty_four_processes_start_at_once_without_lock_timeouts(cost, tmp_path: Path) -> None:
    """A torchrun of 64 workers on one region (HAMi PR #155: one global file lock, 8+ processes starting
    together timed out at 10 s+): every one starts, none warns of the lock, the slowest within 10 s even on
    a loaded 2-core CI machine (bench/start_storm.py measures 1, 16 and 64)."""
    tool, shim, fake = cost
    times, errs = start_storm(tool, shim, fake, tmp_path / "c", 64, timeout=60)
    bad = [e for e in errs if e.strip()]
    assert not bad, bad[:3]
    assert len(times) == 64 and times[-1] < 10, times[-5:]
    r = R.read_region(tmp_path / "c")
    assert not r.live_procs() and r.proc_num <= 64, r.proc_num  # every slot given back at exit


def test_creating_a_region_dirties_no_zero_pages(region_tool: Path, region_env: dict, tmp_path: Path) -> None:
    """A fresh (fallocated) file is zero already: creation writes the header, not 2 MB of zeros."""
    if subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip() in (
            "tmpfs", "ramfs"):
        pytest.skip("on tmpfs fallocate itself makes every page resident")
    cache = Path(region_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    subprocess.run([str(region_tool), "attach"], env=region_env, check=True, capture_output=True, timeout=30)
    fd = os.open(cache, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages leave the cache; dirty ones stay
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, R.REGION_SIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    pages = (R.REGION_SIZE + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(R.REGION_SIZE), vec) == 0
    resident = sum(v & 1 for v in vec)
    libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(R.REGION_SIZE))
    os.close(fd)
    assert resident <= 8, f"{resident} of {pages} pages resident after creating the region"
