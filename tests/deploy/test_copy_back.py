"""`vgpu-patch status` after the device plugin's copy-back (a plain `cp` of the vendor file over the live path):
its own exit code, a --json problem and a note in the table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from deploy_support import make_node

from vgpu_patch.report.errors import EXIT_OK, EXIT_REPLACED

REPO = Path(__file__).resolve().parents[2]


def vgpu(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


def test_status_names_a_copy_back(tmp_path: Path, libs: dict[str, Path]) -> None:
    d = make_node(tmp_path, libs["vendor"])
    assert vgpu("deploy", "--local", str(tmp_path), "--no-check", str(libs["v1"])).returncode == 0
    ok = vgpu("status", "--local", str(tmp_path), "--json")
    assert ok.returncode == EXIT_OK, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["nodes"][0]["result"]["replaced_outside"] is False

    subprocess.run(["cp", str(libs["vendor"]), str(d / "libvgpu.so")], check=True)  # what HAMi's plugin does
    res = vgpu("status", "--local", str(tmp_path), "--json")
    assert res.returncode == EXIT_REPLACED == 5, res.stdout + res.stderr
    node = json.loads(res.stdout)["nodes"][0]["result"]
    assert node["replaced_outside"] is True
    assert node["problem"].startswith("replaced outside vgpu-patch (the device plugin's copy-back?): libvgpu.so is ")
    assert "(not ours), but the last recorded change (deploy by vgpu-patch" in node["problem"]
    assert "node agent" in node["problem"] and "device-plugin image" in node["problem"]
    table = vgpu("status", "--local", str(tmp_path))
    assert table.returncode == EXIT_REPLACED and "replaced outside vgpu-patch" in table.stdout, table.stdout

    # put back by any tool: the truth again
    assert vgpu("deploy", "--local", str(tmp_path), "--no-check", str(libs["v1"])).returncode == 0
    assert vgpu("status", "--local", str(tmp_path)).returncode == EXIT_OK


def test_a_node_never_deployed_is_not_a_copy_back(tmp_path: Path, libs: dict[str, Path]) -> None:
    make_node(tmp_path, libs["vendor"])
    shutil.copyfile(libs["vendor"], tmp_path / "usr/local/vgpu/libvgpu.so.bak")
    res = vgpu("status", "--local", str(tmp_path), "--json")
    node = json.loads(res.stdout)["nodes"][0]["result"]
    assert res.returncode == EXIT_OK and not node["replaced_outside"] and node["problem"] is None
    assert node["other_files"] == ["libvgpu.so.bak"]
