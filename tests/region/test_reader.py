"""`vgpu-patch region show` and the decoder, on files a vendor-format writer leaves behind."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_patch.cli import cli
from vgpu_patch.shim import region as R

GiB = 1 << 30
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]


def _vendor_file(path: Path, **kw) -> Path:
    defaults = dict(
        uuids=UUIDS, limit=[4 * GiB, 2 * GiB], sm_limit=[50, 0], priority=0, utilization_switch=1,
        recent_kernel=2, last_kernel_time=1_764_000_000, owner_pid=4242,
        procs=[
            R.SlotSpec(pid=100, hostpid=9100, used={0: 1 * GiB, 1: 256 << 20}, sm_util={0: 37}),
            R.SlotSpec(pid=101, used={0: 3 * GiB}, status=0),  # exited: the monitor skips it
            R.SlotSpec(pid=102, hostpid=9102, used={0: 512 << 20}, status=2),
        ],
    )
    defaults.update(kw)
    path.write_bytes(R.encode(**defaults))
    return path


def test_decode_sums_like_the_monitor(tmp_path: Path) -> None:
    r = R.read_region(_vendor_file(tmp_path / "c"))
    assert (r.major_version, r.minor_version, r.device_num) == (1, 2, 2)
    assert r.uuids[:2] == UUIDS
    assert r.used(0) == GiB + (512 << 20)  # status 0 slot not counted
    assert r.used(1) == 256 << 20
    assert [p.pid for p in r.live_procs()] == [100, 102]
    assert r.procs[0].sm_util[0] == 37
    assert (r.priority, r.utilization_switch, r.recent_kernel) == (0, 1, 2)


def test_show_json_is_one_document(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["region", "show", "--json", str(_vendor_file(tmp_path / "c"))])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["version"] == "1.2"
    assert doc["devices"][0] == {"index": 0, "uuid": UUIDS[0], "limit": 4 * GiB, "used": GiB + (512 << 20),
                                 "sm_limit": 50, "sm_budget_ns": None}  # a vendor file keeps no compute ledger
    assert [(p["pid"], p["hostpid"], p["status_name"]) for p in doc["procs"]] == [
        (100, 9100, "running"), (102, 9102, "suspended")]
    assert doc["procs"][0]["used"] == [GiB, 256 << 20]
    assert doc["last_kernel_time"] == 1_764_000_000


def test_show_table(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["region", "show", str(_vendor_file(tmp_path / "c"))])
    assert res.exit_code == 0, res.output
    out = res.output
    for needle in ("layout 1.2", "4096.0 MiB", "1536.0 MiB", "50%", "9100", "suspended", "priority 0",
                   "utilization_switch 1", "recent_kernel 2"):
        assert needle in out, needle
    assert "\x1b[" not in out  # no colours when not on a terminal


@pytest.mark.parametrize(
    "kw, content, message",
    [
        ({"magic": 1234}, None, "magic 1234 is not 19920718"),
        ({"major": 2}, None, "layout major version 2"),
        ({}, b"\0" * 1000, "1000 bytes, a layout 1.2 region is 2008952"),
    ],
)
def test_show_rejects_bad_files_in_one_line(tmp_path: Path, kw: dict, content: bytes | None, message: str) -> None:
    p = tmp_path / "c"
    if content is None:
        _vendor_file(p, **kw)
    else:
        p.write_bytes(content)
    from vgpu_patch.report.errors import VgpuPatchError

    with pytest.raises(VgpuPatchError) as ei:
        R.read_region(p)
    assert message in str(ei.value) and "\n" not in str(ei.value)


def test_cli_exit_code_and_message_for_bad_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = tmp_path / "c"
    p.write_bytes(b"x" * 10)
    cp = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "region", "show", str(p)],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1
    assert cp.stdout == ""
    assert cp.stderr.count("\n") == 1 and "truncated or not a region" in cp.stderr


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(R.RegionError, match="no such file"):
        R.read_region(tmp_path / "nope")


def test_corrupt_proc_num_is_bounded(tmp_path: Path) -> None:
    buf = bytearray(R.encode(uuids=UUIDS, limit=[0]))
    import struct

    struct.pack_into("<i", buf, R.REGION_FIELDS["proc_num"][0], 99999)
    r = R.decode(bytes(buf))
    assert len(r.procs) == R.MAX_PROCS


def test_help_has_example() -> None:
    res = CliRunner().invoke(cli, ["region", "show", "--help"])
    assert res.exit_code == 0 and "Example" in res.output


def test_vendor_file_read_by_our_c_attach(tmp_path: Path, region_tool: Path, region_env: dict) -> None:
    """A region left by a vendor writer: our C side keeps its limits, counts its live usage, and
    reclaims the slot of its dead process (pid 100 does not exist here, status 1)."""
    from regiontools import lines, run_tool

    path = Path(region_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    me = os.getpid()  # a live pid for the "running" vendor slot
    _vendor_file(path, limit=[4 * GiB, 2 * GiB], procs=[
        R.SlotSpec(pid=me, used={0: 1 * GiB}),
        R.SlotSpec(pid=2_000_000_000 % (1 << 22) + 3, used={0: 2 * GiB}),  # no such pid: dead
    ])
    cp = run_tool(region_tool, region_env, "attach", "limit:0", "limit:1", "used:0",
                  f"reserve:0:{2 * GiB}", "used:0", "slot", VGPU_TEST_DEVICES="2")
    out = lines(cp)
    assert out[:3] == ["attach ok", f"limit {4 * GiB}", f"limit {2 * GiB}"]
    # attach reaped the dead slot (its 2 GiB no longer counted) and reused it in place
    assert out[3] == f"used {GiB}"
    assert out[4] == "reserve ok"  # 1 GiB (live vendor) + 2 GiB (ours) <= 4 GiB
    assert out[5] == f"used {3 * GiB}"
    assert out[6] == "slot 1"
    r = R.read_region(path)
    assert r.procs[0].pid == me and r.procs[0].used[0] == GiB  # the live vendor slot never moved
    assert r.proc_num == 2 and r.procs[1].status == 0  # we exited cleanly: our slot is free
