"""Issue 11, point 2: liveness by process identity across pid namespaces (real processes in real
namespaces: `unshare --pid --fork --mount-proc`, root only).

A container restart is a new pid namespace on the same cache file whose pids repeat the old ones:
the region_tool below is pid 1 in its namespace every time."""
from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from regiontools import Held, lines

from vgpu_patch.shim import region as R

MiB = 1 << 20


def _unshare_ok() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare --pid)"
    if not shutil.which("unshare"):
        return "no unshare(1)"
    cp = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    return None if cp.returncode == 0 else f"unshare refused: {cp.stderr.decode().strip()}"


needs_ns = pytest.mark.skipif(bool(_unshare_ok()), reason=str(_unshare_ok()))


def ns_cmd(tool: Path, *steps: str) -> list[str]:
    # --kill-child: SIGKILL to unshare reaches the namespace's init (which ignores its own signals)
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", str(tool), *steps]


def sigkill_in_namespace(tool: Path, env: dict, *steps: str) -> list[str]:
    """Run steps as pid 1 of a fresh pid namespace, then SIGKILL it; the lines it printed."""
    p = subprocess.Popen(ns_cmd(tool, *steps, "wait"), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out = [p.stdout.readline().strip() for _ in steps]
    p.kill()
    p.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-f", f"{tool} {steps[0]}"],
                                                         capture_output=True).stdout.strip():
        time.sleep(0.05)
    return out


def run_ns(tool: Path, env: dict, *steps: str) -> subprocess.CompletedProcess:
    return subprocess.run(ns_cmd(tool, *steps), env=env, capture_output=True, text=True, timeout=60)


@needs_ns
def test_usage_of_a_process_killed_in_an_old_namespace_is_reclaimed(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    cache = Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    out = sigkill_in_namespace(region_tool, env, "attach", "slot", f"reserve:0:{90 * MiB}")
    assert out == ["attach ok", "slot 0", "reserve ok"]  # then SIGKILLed: no destructor ran
    r = R.read_region(cache)
    assert r.used(0) == 90 * MiB and r.procs[0].pid == 1
    # "the container restarts": a new namespace, pid 1 again, on the same file
    cp = run_ns(region_tool, env, "attach", f"reserve:0:{100 * MiB}", "used:0")
    assert lines(cp) == ["attach ok", "reserve ok", f"used {100 * MiB}"], cp.stderr
    assert cp.stderr == ""


@needs_ns
def test_same_pid_in_two_live_namespaces_gets_two_slots(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    cache = Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    a = subprocess.Popen(ns_cmd(region_tool, "attach", "slot", f"reserve:0:{90 * MiB}", "wait"), env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert [a.stdout.readline().strip() for _ in range(3)] == ["attach ok", "slot 0", "reserve ok"]
        cp = run_ns(region_tool, env, "attach", "slot", f"reserve:0:{90 * MiB}", f"reserve:0:{10 * MiB}", "used:0")
        # pid 1 as well, but alive elsewhere: its own slot, and the limit is shared
        assert lines(cp) == ["attach ok", "slot 1", "reserve refused", "reserve ok", f"used {100 * MiB}"]
        r = R.read_region(cache)
        assert [(p.pid, p.used[0]) for p in r.procs if p.status] == [(1, 90 * MiB)]  # b exited cleanly
    finally:
        a.communicate("\n", timeout=30)
    assert R.read_region(cache).used(0) == 0


@needs_ns
def test_a_forked_child_does_not_keep_its_dead_parent_alive(region_tool: Path, region_env: dict) -> None:
    """The liveness lock is closed in the fork child at once: the parent's slot dies with the parent."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    holder = Held(region_tool, env, "attach", f"reserve:0:{80 * MiB}", "forksleep:20000")
    holder.kill()  # the sleeping child lives on, holding a copy of nothing
    out = lines(subprocess.run([str(region_tool), "attach", f"reserve:0:{90 * MiB}"], env=env, capture_output=True,
                               text=True, timeout=30))
    assert out == ["attach ok", "reserve ok"]


def test_stamp_words_are_checked(region_tool: Path, region_env: dict) -> None:
    """Our slot carries start time, namespace, nonce and a check word; a live process is never reaped."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    cache = Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    a = Held(region_tool, env, "attach", f"reserve:0:{50 * MiB}")
    try:
        s = R.read_region(cache).procs[0]
        assert s.pid == a.proc.pid and s.nonce and s.stamp_check
        assert s.pid_ns == os.stat("/proc/self/ns/pid").st_ino and s.starttime
        out = lines(subprocess.run([str(region_tool), "attach", f"reserve:0:{60 * MiB}", f"reserve:0:{50 * MiB}"],
                                   env=env, capture_output=True, text=True, timeout=30))
        assert out == ["attach ok", "reserve refused", "reserve ok"]
    finally:
        a.release()


def _shim_in_ns(shim_env, cache: Path, body: str, **env: str) -> subprocess.Popen:
    import sys
    import textwrap

    from shim.harness import CDEF, PRELUDE

    code = (f"CDEF = {CDEF!r}\n" + PRELUDE + "\ndef wait():\n    sys.stdin.readline()\n" + textwrap.dedent(body))
    e = shim_env.base_env({"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache), **env})
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c", code],
                            env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_ns
def test_shim_container_restart_gets_its_whole_limit_back(shim_env, tmp_path: Path) -> None:
    """The issue's measurement with the real shim: 90 MiB held by a SIGKILLed pid 1, the restarted
    container's pid 1 must get all of its 100 MiB (it got 10 before)."""
    from regiontools import result_line

    cache = tmp_path / "cache"
    body = """
shim.cuInit(0)
ctx_on(0)
emit(rcs=[alloc(int(s) * MiB)[0] for s in os.environ["T_SIZES"].split(",")], pid=os.getpid())
wait()
"""
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_CUDA_DEVICES": "1"}
    first = _shim_in_ns(shim_env, cache, body, T_SIZES="90", **env)
    assert result_line(first) == {"rcs": [0], "pid": 1}
    first.kill()
    first.wait(timeout=30)
    time.sleep(0.2)
    assert R.read_region(cache).used(0) == 90 * MiB  # still counted: nobody has reaped it yet
    second = _shim_in_ns(shim_env, cache, body, T_SIZES="100", **env)
    try:
        assert result_line(second) == {"rcs": [0], "pid": 1}
    finally:
        second.communicate("\n", timeout=60)


def test_a_readers_lock_does_not_keep_a_dead_slot_alive(region_tool: Path, region_env: dict) -> None:
    """Anyone who can read the region can read-lock a slot's liveness byte; only the owner's write
    lock means it lives, so a SIGKILLed owner's usage is still reclaimed."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    cache = Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    holder = Held(region_tool, env, "attach", f"reserve:0:{80 * MiB}")
    nonce = R.read_region(cache).procs[0].nonce
    fd = os.open(cache, os.O_RDONLY)
    try:
        live_byte = (1 << 41) + (nonce & ((1 << 40) - 1))  # c_src/region/ident.c: LIVE_BASE + nonce
        holder.kill()  # its write lock goes with it; a reader's read lock takes the byte
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, live_byte, 1, 0))
        out = lines(subprocess.run([str(region_tool), "attach", f"reserve:0:{90 * MiB}"], env=env,
                                   capture_output=True, text=True, timeout=30))
        assert out == ["attach ok", "reserve ok"]
    finally:
        os.close(fd)
