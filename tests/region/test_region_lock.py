"""Issue 11, point 3: the region lock is never inherited by a fork child, never takeable by a mere
reader of the file, and a stall never costs seconds per operation."""
from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

from regiontools import Held, lines, run_tool

MiB = 1 << 20
LOCK_OFF = 1 << 40


def _lock_ms(out: list[str]) -> list[tuple[int, float]]:
    res = []
    for ln in out:
        if ln.startswith("lock rc="):
            rc, ms = ln[len("lock rc="):].split(" ms=")
            res.append((int(rc), float(ms)))
    return res


def test_fork_child_never_keeps_a_killed_parents_lock(region_tool: Path, region_env: dict) -> None:
    """20 trials: the parent forks a child (no exec, no CUDA) while holding the lock, then is SIGKILLed."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    run_tool(region_tool, env, "attach")
    for _ in range(20):
        holder = Held(region_tool, env, "attach", "forksleep:30000", "lockhold:60000")
        assert holder.lines[-1] == "locked"
        holder.kill()
        out = lines(run_tool(region_tool, env, "attach", "locktime"))
        [(rc, ms)] = _lock_ms(out)
        assert rc == 0 and ms < 500, out


def test_a_reader_cannot_hold_the_lock(region_tool: Path, region_env: dict) -> None:
    """flock(2) by anyone who can read the file, or flock(1), never blocks us: we lock with fcntl."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    run_tool(region_tool, env, "attach")
    path = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # a write lock needs a descriptor opened for writing
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, LOCK_OFF)
            raise AssertionError("a read-only descriptor took a write lock")
        except OSError:
            pass
        out = lines(run_tool(region_tool, env, "attach", "locktime", f"reserve:0:{MiB}"))
        [(rc, ms)] = _lock_ms(out)
        assert rc == 0 and ms < 500 and out[-1] == "reserve ok", out
    finally:
        os.close(fd)


def test_a_stall_costs_one_timeout_not_one_per_operation(region_tool: Path, region_env: dict) -> None:
    """A reader holding a read lock on the lock byte (hostile: our peers take write locks): given up
    on at once with one warning, never waited for."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    run_tool(region_tool, env, "attach")
    fd = os.open(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"], os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, LOCK_OFF, 1, 0))
        t0 = time.monotonic()
        cp = run_tool(region_tool, env, "attach", *["locktime"] * 5, f"reserve:0:{MiB}")
        took = time.monotonic() - t0
        out = lines(cp)
        times = _lock_ms(out)
        assert out[0] == "attach ok" and out[-1] == "reserve ok", out
        assert [rc for rc, _ in times] == [1] * 5
        assert all(ms < 50 for _, ms in times), times
        assert took < 0.5, took  # not even the attach waits out the second
        assert cp.stderr.count("region lock not obtained") == 1, cp.stderr
    finally:
        os.close(fd)
    out = lines(run_tool(region_tool, env, "attach", "locktime"))
    assert _lock_ms(out)[0][0] == 0  # released: back to normal


def test_exec_keeps_no_lock(region_tool: Path, region_env: dict) -> None:
    """The lock descriptor is O_CLOEXEC: an exec'd image (same pid) does not inherit it."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    out = lines(run_tool(region_tool, env, "attach", "exec:attach;locktime;slot"))
    assert out[0] == "attach ok" and out[1] == "attach ok" and _lock_ms(out)[0][0] == 0 and out[-1] == "slot 0"
