"""The region file deleted (or replaced) while processes of the container still hold memory in it: the next
process must not get a fresh budget."""
from __future__ import annotations

import os
from pathlib import Path

from regiontools import Held, lines, run_tool

from vgpu_patch.shim import region as R

MiB = 1 << 20
SIXTY = 60 * MiB


def _path(env: dict) -> Path:
    return Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])


def test_a_new_file_inherits_what_the_old_processes_hold(region_tool: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    old = Held(region_tool, env, "attach", f"reserve:0:{SIXTY}")
    try:
        _path(env).unlink()  # e.g. a cleanup of /tmp, or a sidecar that recreates it
        out = lines(run_tool(region_tool, env, "attach", "used:0", f"reserve:0:{SIXTY}", f"reserve:0:{30 * MiB}"))
        assert out == ["attach ok", f"used {SIXTY}", "reserve refused", "reserve ok"]
        r = R.read_region(_path(env))  # the monitor's view of the new file: the old process is in it
        assert [p.pid for p in r.procs if p.status] == [old.proc.pid] and r.used(0) == SIXTY
    finally:
        old.release()
    # the old process is gone: its copy in the new file is reaped when the room is needed
    out = lines(run_tool(region_tool, env, "attach", f"reserve:0:{90 * MiB}"))
    assert out == ["attach ok", "reserve ok"]


def test_a_replaced_file_inherits_too_and_a_dead_old_process_is_not_copied(region_tool: Path,
                                                                            region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    live = Held(region_tool, env, "attach", f"reserve:0:{SIXTY}")
    dead = Held(region_tool, env, "attach", f"reserve:0:{20 * MiB}")
    try:
        dead.kill()
        p = _path(env)
        tmp = p.with_name(p.name + ".new")
        tmp.write_bytes(b"")
        os.replace(tmp, p)  # an empty file renamed over it: a creator's first open initialises it
        out = lines(run_tool(region_tool, env, "attach", "used:0", f"reserve:0:{50 * MiB}",
                             f"reserve:0:{40 * MiB}"))
        assert out == ["attach ok", f"used {SIXTY}", "reserve refused", "reserve ok"]
    finally:
        live.release()
