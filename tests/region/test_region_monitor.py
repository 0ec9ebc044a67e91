"""Issue 11, point 5: the monitor's signals, with the real shim over the fake driver.
recent_kernel = -1 holds launches back (not for priority 0, not with GPU_CORE_UTILIZATION_POLICY=disable)
until it is >= 0; last_kernel_time is written at creation and on launches, at most once a second."""
from __future__ import annotations

import mmap
import struct
import time
from pathlib import Path

import pytest
from regiontools import result_line, shim_child

from vgpu_patch.shim import region as R

RECENT = R.REGION_FIELDS["recent_kernel"][0]
LAST = R.REGION_FIELDS["last_kernel_time"][0]

LAUNCHER = """
import time
shim.cuInit(0)
ctx_on(0)
emit(rc=alloc(MiB)[0])   # attaches the region
n = [0]
stop = [False]
def loop():
    ctx_on(0)
    while not stop[0]:
        shim.cuLaunchKernel(ffi.NULL, 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL)
        n[0] += 1
        time.sleep(0.002)
t = threading.Thread(target=loop, daemon=True)
t.start()
while True:
    line = sys.stdin.readline()
    if not line.strip():
        break
    emit(n=n[0])
stop[0] = True
t.join(timeout=5)
emit(done=n[0], alive=t.is_alive())
"""


class Launcher:
    def __init__(self, shim_env, cache: Path, **env: str) -> None:
        self.p = shim_child(shim_env, LAUNCHER, cache, FAKE_CUDA_DEVICES="1", CUDA_DEVICE_MEMORY_LIMIT="100m", **env)
        assert result_line(self.p)["rc"] == 0

    def count(self) -> int:
        self.p.stdin.write("n\n")
        self.p.stdin.flush()
        return result_line(self.p)["n"]

    def finish(self) -> tuple[str, str]:
        return self.p.communicate("\n", timeout=60)


def _poke(cache: Path, off: int, fmt: str, value: int) -> None:
    with open(cache, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        struct.pack_into(fmt, m, off, value)


def _launches_while_held(shim_env, cache: Path, **env: str) -> tuple[int, int]:
    """(launches during 0.4 s of recent_kernel = -1, launches in the 0.4 s after it went back to 0)"""
    lau = Launcher(shim_env, cache, **env)
    try:
        time.sleep(0.1)
        assert lau.count() > 0
        _poke(cache, RECENT, "<i", -1)
        time.sleep(0.1)  # a launch already past the check may still land
        a = lau.count()
        time.sleep(0.4)
        held = lau.count() - a
        _poke(cache, RECENT, "<i", 0)
        time.sleep(0.1)
        b = lau.count()
        time.sleep(0.4)
        return held, lau.count() - b
    finally:
        _poke(cache, RECENT, "<i", 0)
        lau.finish()


def test_recent_kernel_minus_one_holds_launches_back(shim_env, tmp_path: Path) -> None:
    held, resumed = _launches_while_held(shim_env, tmp_path / "cache")
    assert held == 0 and resumed > 20, (held, resumed)


@pytest.mark.parametrize("env", [{"GPU_CORE_UTILIZATION_POLICY": "disable"}, {"CUDA_TASK_PRIORITY": "0"}])
def test_no_hold_for_disable_policy_or_high_priority(shim_env, tmp_path: Path, env: dict) -> None:
    held, resumed = _launches_while_held(shim_env, tmp_path / "cache", **env)
    assert held > 20 and resumed > 20, (held, resumed)


def test_hold_also_applies_under_an_sm_limit_and_never_overwrites_the_hold(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    held, resumed = _launches_while_held(shim_env, cache, CUDA_DEVICE_SM_LIMIT="50")
    assert held == 0 and resumed > 20
    assert R.read_region(cache).recent_kernel >= 0


def test_last_kernel_time_at_creation_and_on_launches(shim_env, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = int(time.time())
    lau = Launcher(shim_env, cache)
    try:
        created = R.read_region(cache).last_kernel_time
        assert before - 1 <= created <= time.time() + 1
        _poke(cache, LAST, "<Q", 12345)  # the monitor reads it; we stamp it again within a second
        time.sleep(1.3)
        lau.count()
        stamped = R.read_region(cache).last_kernel_time
        assert stamped >= before, stamped
    finally:
        lau.finish()


def test_no_sm_limit_launches_make_no_driver_call(shim_env, tmp_path: Path) -> None:
    """Without an SM limit the hook makes no driver call of its own (region attached or not)."""
    body = """
shim.cuInit(0)
ctx_on(0)
rcs = [shim.cuLaunchKernel(ffi.NULL, 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL) for _ in range(5)]
emit(rcs=rcs, calls=fake.fake_calls(b"cuLaunchKernel"), dev=fake.fake_calls(b"cuCtxGetDevice"))
"""
    p = shim_child(shim_env, body, tmp_path / "cache", FAKE_CUDA_DEVICES="1")
    res = result_line(p)
    p.communicate(timeout=60)
    assert res == {"rcs": [0] * 5, "calls": 5, "dev": 0}
