"""The README's first command works end to end: build, check, deploy, status, rollback on a fake node."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_demo_round_trip(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vgpu_patch.cli", "demo", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    live = tmp_path / "node/usr/local/vgpu/libvgpu.so"
    state = tmp_path / "node/usr/local/vgpu/.vgpu-patch"
    history = [json.loads(h) for h in (state / "history.jsonl").read_text().splitlines()]
    assert [h["action"] for h in history] == ["deploy", "rollback"]
    vendor_sha = history[0]["from_sha256"]
    # rolled back: the live file is the vendor stand-in again, byte for byte, as its backup holds it
    assert _sha(live) == vendor_sha == history[1]["to_sha256"]
    assert live.read_bytes() == (state / "backups" / f"{vendor_sha}.so").read_bytes()
    for step in ("build", "check", "deploy", "status", "rollback"):
        assert f"$ vgpu-patch {step}" in proc.stderr
    # checked against the file it replaces (the node's vendor stand-in), and planned before it is done
    assert f"$ vgpu-patch check {tmp_path}/out/libvgpu.so --vendor {live}" in proc.stderr
    assert f"$ vgpu-patch deploy --local {tmp_path}/node --dry-run" in proc.stderr
    assert f"against vendor {live}" in proc.stdout
    assert f"files kept in {tmp_path}" in proc.stderr


def test_demo_without_a_workdir_leaves_nothing_behind(tmp_path: Path) -> None:
    import os

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "demo"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp.iterdir()) == [] and "temporary files removed" in proc.stderr
