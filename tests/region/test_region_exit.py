"""A process's memory stays counted until the process is gone, not only until our destructor ran.

The driver frees what a process holds (its context, pool reserves, allocations nobody freed) only
when the process is gone, after every destructor, and the kernel may release our liveness byte
before the driver's descriptors. So an exiting process leaves its bytes as an exit hold (status 0
for HAMi's monitor, still counted by our limit checks), and a slot whose liveness byte is gone stays
counted while its process is still exiting. The soak (tests/shim/test_soak.py) saw both as a
container's physical use above its limit."""
from __future__ import annotations

import subprocess
from pathlib import Path

from regiontools import Held, lines, run_tool

from vgpu_patch.shim import region as R

MiB = 1 << 20
SIXTY = 60 * MiB


def _env(region_env: dict) -> dict:
    return {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}


def _reserve_sixty(tool: Path, env: dict) -> list[str]:
    return lines(run_tool(tool, env, "attach", f"reserve:0:{SIXTY}"))


def test_exit_hold_counts_until_the_process_is_gone(region_tool: Path, region_env: dict) -> None:
    env = _env(region_env)
    leaving = Held(region_tool, env, "attach", f"reserve:0:{SIXTY}", "detach")  # our destructor ran
    try:
        assert leaving.lines == ["attach ok", "reserve ok", "detach ok"]
        r = R.read_region(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
        assert r.used(0) == 0 and not r.live_procs()  # the monitor stops counting it, as for a vendor exit
        assert _reserve_sixty(region_tool, env) == ["attach ok", "reserve refused"]  # still held
        assert lines(run_tool(region_tool, env, "attach", "used:0")) == ["attach ok", f"used {SIXTY}"]
    finally:
        leaving.release()
    assert leaving.proc.returncode == 0
    assert _reserve_sixty(region_tool, env) == ["attach ok", "reserve ok"]  # gone: the hold is dropped


def test_after_our_destructor_a_limit_refuses_what_other_threads_still_ask(region_tool: Path,
                                                                          region_env: dict) -> None:
    """Threads run on while a process exits. Once its slot is an exit hold nothing counts what they take,
    and the per-process fallback would have let them past the container's limit: refused instead."""
    out = lines(run_tool(region_tool, _env(region_env), "attach", f"reserve:0:{SIXTY}", "detach", f"reserve:0:{MiB}"))
    assert out == ["attach ok", "reserve ok", "detach ok", "reserve refused"]
    unlimited = {**region_env, "CUDA_DEVICE_MEMORY_SHARED_CACHE": region_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] + "2"}
    out = lines(run_tool(region_tool, unlimited, "attach", "detach", f"reserve:0:{MiB}"))  # no limit to hold to
    assert out == ["attach ok", "detach ok", "reserve ok"]


def test_a_process_holding_nothing_frees_its_slot_at_exit(region_tool: Path, region_env: dict) -> None:
    env = _env(region_env)
    out = lines(run_tool(region_tool, env, "attach", f"reserve:0:{SIXTY}", f"release:0:{SIXTY}", "detach",
                         "procnum"))
    assert out == ["attach ok", "reserve ok", "release ok", "detach ok", "procnum 1"]
    r = R.read_region(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    assert r.procs[0].pid == 0 and r.procs[0].status == 0  # free for the next process, nothing held


def test_an_exiting_process_counts_after_its_liveness_byte_is_released(region_tool: Path,
                                                                       region_env: dict) -> None:
    env = _env(region_env)
    dying = subprocess.Popen([str(region_tool), "attach", f"reserve:0:{SIXTY}", "dying"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert dying.stdout is not None
        assert [dying.stdout.readline().strip() for _ in range(3)] == ["attach ok", "reserve ok", "dying"]
        # its byte is free and its main thread a zombie, but a thread still runs: the memory may be held
        assert _reserve_sixty(region_tool, env) == ["attach ok", "reserve refused"]
    finally:
        dying.communicate("\n", timeout=30)
    assert _reserve_sixty(region_tool, env) == ["attach ok", "reserve ok"]  # gone: reaped
