"""Issue 11, point 4: ours beside a vendor-format writer (c_src/tests/region/vendor_double.c) on one
file: stale unused[] never makes a live vendor process look dead, a compaction that moves our slot
never loses or doubles our usage, and the vendor's sm_limit = 100 means "no SM limit" silently."""
from __future__ import annotations

import subprocess
from pathlib import Path

from regiontools import Held, lines, run_tool
from test_region_identity import needs_ns, sigkill_in_namespace

from vgpu_patch.shim import region as R

MiB = 1 << 20


def _cache(env: dict) -> Path:
    return Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])


def test_compaction_moving_our_slot_keeps_our_usage(region_tool: Path, vendor_double: Path, region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    vendor = Held(vendor_double, env, "attach", "slot", f"reserve:0:{10 * MiB}")
    assert vendor.lines == ["attach ok", "slot 0", "reserve ok"]
    ours = subprocess.Popen([str(region_tool), "attach", "slot", f"reserve:0:{60 * MiB}", "wait", "slot",
                             f"reserve:0:{30 * MiB}", f"reserve:0:{20 * MiB}", "used:0", "procnum"],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert [ours.stdout.readline().strip() for _ in range(3)] == ["attach ok", "slot 1", "reserve ok"]
    assert lines(run_tool(vendor_double, env, "attach", "used:0")) == ["attach ok", f"used {70 * MiB}"]
    # the vendor process exits and compacts: our slot moves from 1 to 0, proc_num shrinks to 1
    vendor.proc.stdin.write("\n")
    vendor.proc.stdin.flush()
    assert vendor.proc.wait(timeout=30) == 0
    subprocess.run([str(vendor_double), "attach", "exit"], env=env, check=True, capture_output=True, timeout=30)
    r = R.read_region(_cache(env))
    assert r.proc_num == 1 and r.procs[0].pid == ours.pid and r.used(0) == 60 * MiB
    out, err = ours.communicate("\n", timeout=30)
    # found itself at 0; 60 + 30 fits, 20 more does not (no lost usage); the sum is 90 (no double count)
    assert out.split("\n")[:-1] == ["woke", "slot 0", "reserve ok", "reserve refused", f"used {90 * MiB}",
                                     "procnum 1"], out
    assert "warn" not in err.lower() and err == "", err


def test_vendor_taking_our_slot_over_is_not_reaped(region_tool: Path, vendor_double: Path, region_env: dict) -> None:
    """Same namespace: our process dies, a vendor process reuses the slot without touching unused[]."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    subprocess.run([str(region_tool), "attach", f"reserve:0:{10 * MiB}", "kill"], env=env, timeout=30)
    stale = R.read_region(_cache(env)).procs[0]
    assert stale.nonce and stale.status == 1
    # the vendor reaps the dead slot by pid, then appends or reuses; either way unused[] stays
    vendor = Held(vendor_double, env, "attach", f"reserve:0:{60 * MiB}")
    try:
        out = lines(run_tool(region_tool, env, "attach", f"reserve:0:{50 * MiB}", f"reserve:0:{40 * MiB}", "used:0"))
        assert out == ["attach ok", "reserve refused", "reserve ok", f"used {100 * MiB}"]
    finally:
        vendor.release()


@needs_ns
def test_stale_stamp_under_a_live_vendor_with_the_same_pid(region_tool: Path, vendor_double: Path,
                                                          region_env: dict) -> None:
    """The worst case of stale unused[]: a container restart makes the vendor process pid 1 again, it takes
    over the slot our killed pid 1 left (a valid stamp of ours, its pid matching), and our next process must
    still count it: only a process that maps the region is taken for the slot's owner, and it does."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    assert sigkill_in_namespace(region_tool, env, "attach", f"reserve:0:{10 * MiB}") == ["attach ok", "reserve ok"]
    assert R.read_region(_cache(env)).procs[0].nonce
    ours = ";".join([str(region_tool), "attach", f"reserve:0:{50 * MiB}", f"reserve:0:{40 * MiB}", "used:0"])
    cp = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", str(vendor_double), "attach",
                         "slot", f"reserve:0:{60 * MiB}", f"spawn:{ours}", "used:0"], env=env, capture_output=True,
                        text=True, timeout=60)
    assert cp.stdout.split("\n")[:-1] == ["attach ok", "slot 0", "reserve ok", "attach ok", "reserve refused",
                                          "reserve ok", f"used {100 * MiB}", "spawn exit 0", f"used {60 * MiB}"], cp


def test_vendor_sm_limit_100_means_no_limit_without_warnings(region_tool: Path, vendor_double: Path,
                                                            region_env: dict) -> None:
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    vendor = Held(vendor_double, env, "attach")
    try:
        assert R.read_region(_cache(env)).sm_limit[0] == 100
        cp = run_tool(region_tool, env, "attach", "smlimit:0")
        assert lines(cp) == ["attach ok", "smlimit 100"] and cp.stderr == ""
        cp = run_tool(region_tool, env, "attach", CUDA_DEVICE_SM_LIMIT="100")
        assert cp.stderr == ""
        cp = run_tool(region_tool, env, "attach", CUDA_DEVICE_SM_LIMIT="40")  # a real disagreement is said
        assert "SM limit" in cp.stderr and "40%" in cp.stderr and "stricter" in cp.stderr
    finally:
        vendor.release()


def test_vendor_region_sees_our_usage(region_tool: Path, vendor_double: Path, region_env: dict) -> None:
    """The other direction: the vendor's sum counts our slots, so its reserve respects our usage."""
    env = {**region_env, "CUDA_DEVICE_MEMORY_LIMIT": "100m"}
    ours = Held(region_tool, env, "attach", f"reserve:0:{70 * MiB}")
    try:
        out = lines(run_tool(vendor_double, env, "attach", f"reserve:0:{40 * MiB}", f"reserve:0:{30 * MiB}", "exit"))
        assert out == ["attach ok", "reserve refused", "reserve ok", "exit ok"]
        r = R.read_region(_cache(env))
        assert r.procs[0].pid == ours.proc.pid and r.used(0) == 70 * MiB  # the vendor's exit compacted around us
    finally:
        ours.release()
