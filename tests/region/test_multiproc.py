"""Several real processes on one region file: shared limit, reclamation, startup storms, warnings."""
from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

from regiontools import Held, lines, run_tool

from vgpu_patch.shim import region as R

MiB = 1 << 20
LIMIT = 100 * MiB
SIXTY = 60 * MiB


def _path(env: dict) -> Path:
    return Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])


def test_limit_holds_across_processes(region_tool: Path, region_env: dict) -> None:
    a = Held(region_tool, region_env, "attach", f"reserve:0:{SIXTY}", CUDA_DEVICE_MEMORY_LIMIT="100m")
    try:
        assert a.lines == ["attach ok", "reserve ok"]
        out = lines(run_tool(region_tool, region_env, "attach", f"reserve:0:{SIXTY}", f"reserve:0:{30 * MiB}",
                             CUDA_DEVICE_MEMORY_LIMIT="100m"))
        assert out == ["attach ok", "reserve refused", "reserve ok"]
        r = R.read_region(_path(region_env))
        assert r.used(0) == SIXTY  # the second process exited and freed its 30 MiB
    finally:
        a.release()
    assert R.read_region(_path(region_env)).used(0) == 0


def test_sigkilled_process_is_reclaimed_without_moving_live_slots(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    first = Held(region_tool, env, "attach", "slot", f"reserve:0:{10 * MiB}")
    victim = Held(region_tool, env, "attach", "slot", f"reserve:0:{SIXTY}")
    third = Held(region_tool, env, "attach", "slot", f"reserve:0:{10 * MiB}")
    try:
        assert [first.lines[1], victim.lines[1], third.lines[1]] == ["slot 0", "slot 1", "slot 2"]
        victim.kill()  # SIGKILL: no destructor runs, its slot still claims 60 MiB
        r = R.read_region(_path(env))
        assert r.used(0) == 80 * MiB and r.procs[1].status == 1
        out = lines(run_tool(region_tool, env, "attach", "slot", f"reserve:0:{SIXTY}"))
        assert out == ["attach ok", "slot 1", "reserve ok"]  # reaped, reused in place
        r = R.read_region(_path(env))
        # the live processes kept their slots and their usage
        assert (r.procs[0].pid, r.procs[0].used[0]) == (first.proc.pid, 10 * MiB)
        assert (r.procs[2].pid, r.procs[2].used[0]) == (third.proc.pid, 10 * MiB)
        assert r.proc_num == 3
    finally:
        first.release()
        third.release()


def test_reserve_reaps_a_dead_peer_that_blocks_the_limit(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    live = subprocess.Popen([str(region_tool), "attach", f"reserve:0:{10 * MiB}", "wait", f"reserve:0:{SIXTY}",
                             "used:0"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert [live.stdout.readline().strip() for _ in range(2)] == ["attach ok", "reserve ok"]
    # a peer that attached after `live`, then died holding 80 MiB
    subprocess.run([str(region_tool), "attach", f"reserve:0:{80 * MiB}", "kill"], env=env, timeout=30)
    assert R.read_region(_path(env)).used(0) == 90 * MiB
    # `live` reserves now: the sum says no, reaping the dead peer says yes
    out, _ = live.communicate("\n", timeout=30)
    assert out.split("\n")[:-1] == ["woke", "reserve ok", f"used {70 * MiB}"]


def test_twenty_processes_start_at_once(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    procs = [subprocess.Popen([str(region_tool), "attach", "slot", f"reserve:0:{5 * MiB}", "wait"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(20)]
    try:
        outs = [[p.stdout.readline().strip() for _ in range(3)] for p in procs]
        assert all(o[0] == "attach ok" and o[2] == "reserve ok" for o in outs), outs
        slots = sorted(int(o[1].split()[1]) for o in outs)
        assert slots == list(range(20))  # one slot each, none shared, no gaps
        r = R.read_region(_path(env))
        assert r.used(0) == 100 * MiB and r.proc_num == 20
        assert lines(run_tool(region_tool, env, "attach", "reserve:0:1")) == ["attach ok", "reserve refused"]
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)
    assert R.read_region(_path(env)).used(0) == 0


def test_inconsistent_limits_are_reported_and_region_wins(region_tool: Path, region_env: dict) -> None:
    a = Held(region_tool, region_env, "attach", CUDA_DEVICE_MEMORY_LIMIT="100m", CUDA_DEVICE_SM_LIMIT="30")
    try:
        cp = run_tool(region_tool, region_env, "attach", "limit:0", "smlimit:0",
                      CUDA_DEVICE_MEMORY_LIMIT="2g", CUDA_DEVICE_SM_LIMIT="50")
        assert lines(cp) == ["attach ok", f"limit {LIMIT}", "smlimit 30"]
        warn = [ln for ln in cp.stderr.splitlines() if "memory limit" in ln]
        assert len(warn) == 1, cp.stderr
        assert f"env gives {2 << 30} bytes" in warn[0] and f"holds {LIMIT} bytes" in warn[0]
        assert str(_path(region_env)) in warn[0] and "using the region's" in warn[0]
        assert any("SM limit" in ln and "50%" in ln and "30%" in ln for ln in cp.stderr.splitlines())
        # a consistent process says nothing
        quiet = run_tool(region_tool, region_env, "attach", CUDA_DEVICE_MEMORY_LIMIT="100m",
                         CUDA_DEVICE_SM_LIMIT="30")
        assert quiet.stderr == ""
    finally:
        a.release()


def test_file_mode_is_0600_whatever_the_umask(region_tool: Path, region_env: dict) -> None:
    def run_with_umask(mask: int, **extra: str) -> int:
        _path(region_env).unlink(missing_ok=True)
        subprocess.run([str(region_tool), "attach"], env={**region_env, **extra}, check=True, timeout=30,
                       preexec_fn=lambda: os.umask(mask), capture_output=True)
        return stat.S_IMODE(_path(region_env).stat().st_mode)

    assert run_with_umask(0o000) == 0o600
    assert run_with_umask(0o077) == 0o600
    assert run_with_umask(0o077, VGPU_SHARED_CACHE_MODE="0660") == 0o660


def test_symlink_and_foreign_files_are_never_clobbered(region_tool: Path, region_env: dict, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 100)
    _path(region_env).symlink_to(victim)
    cp = run_tool(region_tool, region_env, "attach", "reserve:0:5", CUDA_DEVICE_MEMORY_LIMIT="100m")
    assert lines(cp) == ["attach failed", "reserve unattached"] and "symlink" in cp.stderr
    _path(region_env).unlink()
    _path(region_env).write_bytes(b"precious" * 100)
    cp = run_tool(region_tool, region_env, "attach")
    assert lines(cp) == ["attach failed"] and "800 bytes" in cp.stderr
    assert victim.read_bytes() == _path(region_env).read_bytes() == b"precious" * 100


def test_wrong_major_version_is_refused(region_tool: Path, region_env: dict) -> None:
    _path(region_env).write_bytes(R.encode(uuids=["GPU-x"], limit=[LIMIT], major=2))
    cp = run_tool(region_tool, region_env, "attach")
    assert lines(cp) == ["attach failed"] and "layout 2.2" in cp.stderr


def test_dead_lock_holder_never_blocks(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    run_tool(region_tool, env, "attach")
    holder = Held(region_tool, env, "attach", "lockhold:60000")  # holds the lock for a minute...
    assert holder.lines[-1] == "locked"
    holder.kill()  # ...but is SIGKILLed while holding it
    t0 = time.monotonic()
    out = lines(run_tool(region_tool, env, "attach", "reserve:0:1"))
    assert out == ["attach ok", "reserve ok"]
    assert time.monotonic() - t0 < 2


def test_forked_child_gets_its_own_slot_and_lock(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    out = lines(run_tool(region_tool, env, "attach", "slot", f"reserve:0:{SIXTY}",
                         f"fork:slot;reserve:0:{SIXTY};reserve:0:{10 * MiB};used:0", "used:0"))
    assert out == ["attach ok", "slot 0", "reserve ok", "slot 1", "reserve refused", "reserve ok",
                   f"used {70 * MiB}", "child exit 0", f"used {70 * MiB}"]  # child _exit()ed: reaped later


def test_exec_reuses_the_slot_of_its_previous_image(region_tool: Path, region_env: dict) -> None:
    """After exec the old image's allocations are gone; the slot with our pid is ours again, in place."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    other = Held(region_tool, env, "attach", f"reserve:0:{5 * MiB}")
    try:
        out = lines(run_tool(region_tool, env, "attach", "slot", f"reserve:0:{90 * MiB}",
                             f"exec:attach;slot;used:0;reserve:0:{90 * MiB}"))
        assert out == ["attach ok", "slot 1", "reserve ok", "attach ok", "slot 1", f"used {5 * MiB}", "reserve ok"]
    finally:
        other.release()


def test_unchecked_namespace_words_are_not_trusted(region_tool: Path, region_env: dict) -> None:
    """unused[] words without our check word (a vendor slot reusing a slot of an older build, or an
    older build itself) are stale as far as we know: the slot is judged by its pid, as the vendor does.
    Liveness across namespaces comes from the checked stamp and its liveness lock (test_region_identity.py)."""
    foreign = os.stat("/proc/self/ns/pid").st_ino + 1
    _path(region_env).write_bytes(R.encode(uuids=["GPU-x"], limit=[LIMIT], procs=[
        R.SlotSpec(pid=2_000_000 + 7, used={0: 80 * MiB}, pid_ns=foreign),  # not a pid here, no check word
        R.SlotSpec(pid=os.getpid(), used={0: 10 * MiB}, pid_ns=foreign, starttime=1),  # alive here: kept
    ]))
    out = lines(run_tool(region_tool, region_env, "attach", "used:0", f"reserve:0:{30 * MiB}", "slot"))
    assert out == ["attach ok", f"used {10 * MiB}", "reserve ok", "slot 0"]
    assert R.read_region(_path(region_env)).procs[1].used[0] == 10 * MiB


def test_priority_mismatch_is_reported(region_tool: Path, region_env: dict) -> None:
    a = Held(region_tool, region_env, "attach", CUDA_TASK_PRIORITY="0")
    try:
        cp = run_tool(region_tool, region_env, "attach", CUDA_TASK_PRIORITY="1")
        assert "CUDA_TASK_PRIORITY" in cp.stderr and "gives 1" in cp.stderr and "holds 0" in cp.stderr
        assert R.read_region(_path(region_env)).priority == 0
    finally:
        a.release()
