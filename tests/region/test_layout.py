"""The C layout (offsetof printed by the compiled header) and the Python decoder's table agree."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from regiontools import C_SRC, run_tool

from vgpu_patch.shim import region as R


def _python_table() -> dict[str, int]:
    t: dict[str, int] = {}
    for name, off in R.MEMORY_FIELDS.items():
        t[f"vgpu_device_memory_t.{name}"] = off
    for name, off in R.UTIL_FIELDS.items():
        t[f"vgpu_device_util_t.{name}"] = off
    for name, (off, _fmt) in R.SLOT_FIELDS.items():
        t[f"vgpu_proc_slot_t.{name}"] = off
    for name, (off, _fmt) in R.REGION_FIELDS.items():
        t[f"vgpu_region_t.{name}"] = off
    t["sizeof.vgpu_device_memory_t"] = R.MEMORY_SIZE
    t["sizeof.vgpu_device_util_t"] = R.UTIL_SIZE
    t["sizeof.vgpu_proc_slot_t"] = R.SLOT_SIZE
    t["sizeof.vgpu_region_t"] = R.REGION_SIZE
    t["ledger.offset"] = R.ledger_offset(0)
    t["ledger.check"] = R.LEDGER_CHECK
    return t


def test_c_offsets_match_python_table(region_tool: Path, region_env: dict[str, str]) -> None:
    c = json.loads(run_tool(region_tool, region_env, "offsets").stdout)
    assert c == _python_table()
    assert c["sizeof.vgpu_region_t"] == 2_008_952


def test_python_table_is_self_consistent() -> None:
    # procs[] fills exactly the gap before proc_num; the region ends right after sem_postinit
    assert R.REGION_FIELDS["procs"][0] + R.MAX_PROCS * R.SLOT_SIZE == R.REGION_FIELDS["proc_num"][0]
    assert R.REGION_FIELDS["sem_postinit"][0] + R.SEM_SIZE == R.REGION_SIZE


@pytest.mark.parametrize("target", ["aarch64-linux-gnu.2.17", "x86_64-linux-gnu.2.17"])
def test_static_asserts_hold_for_target(tmp_path: Path, target: str) -> None:
    """layout.h's _Static_asserts (every offset, sem_t == 32 B) compile for both architectures."""
    try:
        import ziglang  # noqa: F401
    except ImportError:
        pytest.skip("ziglang not installed")
    src = tmp_path / "l.c"
    src.write_text('#include "region/layout.h"\nint vgpu_layout_probe;\n')
    cp = subprocess.run(
        ["python3", "-m", "ziglang", "cc", "-target", target, "-Wall", "-Wextra", "-Werror", f"-I{C_SRC}",
         "-c", str(src), "-o", str(tmp_path / "l.o")],
        capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
