"""The node agent against a temporary host root: install, repair, respect, rollback, refuse, report."""
from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
from agent_helpers import TIMEOUT, Host, Image, hami_copy_back, sha, wait_for
from click.testing import CliRunner

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.commands.agent import cli
from vgpu_patch.report.errors import ElfError, IntegrityError


def args(image: Image, host: Host, *extra: str) -> list[str]:
    return ["--library", str(image.library), "--host-root", str(host.root), "--target-dir", "/usr/local/vgpu", *extra]


def test_once_installs_with_the_cli_protocol(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    status_file = tmp_path / "status.json"
    res = CliRunner().invoke(cli, args(image, host, "--once", "--json", "--status-file", str(status_file)))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ready"] and doc["state"] == "ok" and doc["deploys"] == 1
    assert sha(host.live) == image.sha256
    (line,) = host.history()
    got = (line["action"], line["tool"], line["from_sha256"], line["to_sha256"])
    assert got == ("deploy", "agent", sha(vendor), image.sha256)
    assert line["path"] == "/usr/local/vgpu/libvgpu.so"
    assert (host.state / "backups" / f"{sha(vendor)}.so").read_bytes() == vendor.read_bytes()
    assert json.loads(status_file.read_text())["live_sha256"] == image.sha256
    assert CliRunner().invoke(cli, args(image, host, "--probe")).exit_code == 0

    again = CliRunner().invoke(cli, args(image, host, "--once", "--status-file", str(status_file)))
    assert again.exit_code == 0 and len(host.history()) == 1  # nothing to do: no new record


def test_fresh_host_gets_the_library(image: Image, host: Host) -> None:
    host.live.unlink()
    assert CliRunner().invoke(cli, args(image, host, "--probe")).exit_code == 1
    res = CliRunner().invoke(cli, args(image, host, "--once", "--status-file", str(host.root / "s.json")))
    assert res.exit_code == 0, res.output
    assert sha(host.live) == image.sha256 and host.history()[0]["from_sha256"] is None


@pytest.mark.watch("inotify", 30.0)
def test_copy_back_is_reverted_at_once_with_inotify(running: Agent, image: Image, host: Host, vendor: Path) -> None:
    assert running.status.watch == "inotify"
    assert sha(host.live) == image.sha256
    hami_copy_back(vendor, host.live)
    took = wait_for(lambda: running.status.reapplies == 1 and sha(host.live) == image.sha256)
    assert took < 15.0  # inside the 30 s interval: the event woke the agent (slack for a loaded machine)
    last = host.history()[-1]
    got = (last["action"], last["tool"], last["from_sha256"], last["to_sha256"])
    assert got == ("reapply", "agent", sha(vendor), image.sha256)
    assert running.status.state == "ok" and running.status.ready


@pytest.mark.watch("poll", 0.2)
def test_copy_back_is_reverted_by_polling(running: Agent, image: Image, host: Host, vendor: Path) -> None:
    assert running.status.watch == "poll"
    hami_copy_back(vendor, host.live)
    wait_for(lambda: running.status.reapplies == 1 and sha(host.live) == image.sha256)
    # the plugin writes its versioned name as well: the agent follows the live-file rule
    (host.libdir / "libvgpu.so.2.5.0").write_bytes(vendor.read_bytes())
    wait_for(lambda: running.status.reapplies == 2 and sha(host.libdir / "libvgpu.so.2.5.0") == image.sha256)
    assert host.history()[-1]["path"] == "/usr/local/vgpu/libvgpu.so.2.5.0"


@pytest.mark.watch("inotify", 30.0)
def test_operator_rollback_is_respected(running: Agent, image: Image, host: Host, vendor: Path) -> None:
    res = CliRunner().invoke(cli, args(image, host, "--rollback", "--json"))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["changed"] is True
    assert host.live.read_bytes() == vendor.read_bytes()  # byte-identical
    wait_for(lambda: running.status.state == "yielded")
    assert running.status.yielded_to["action"] == "rollback"
    time.sleep(0.3)
    assert host.live.read_bytes() == vendor.read_bytes() and running.status.reapplies == 0
    assert CliRunner().invoke(cli, args(image, host, "--probe")).exit_code == 1
    assert host.history()[-1]["action"] == "rollback"


def test_sha_mismatch_is_refused(image: Image, host: Host, vendor: Path) -> None:
    res = CliRunner().invoke(cli, args(image, host, "--once", "--sha256", "ab" * 32))
    assert res.exit_code != 0 and isinstance(res.exception, IntegrityError)
    assert "nothing on the host was touched" in str(res.exception)
    (image.library.parent / "libvgpu.so.json").write_text(json.dumps({"sha256": "cd" * 32}))
    with pytest.raises(IntegrityError, match=r"libvgpu\.so\.json expects"):
        Agent(AgentConfig(library=image.library, host_root=host.root))
    (image.library.parent / "libvgpu.so.json").unlink()
    with pytest.raises(IntegrityError, match="no expected sha256"):
        Agent(AgentConfig(library=image.library, host_root=host.root))
    assert host.live.read_bytes() == vendor.read_bytes() and not host.state.exists()


def test_non_elf_content_is_refused(image: Image, host: Host, vendor: Path) -> None:
    image.library.write_bytes(b"#!/bin/sh\necho not a library\n")
    with pytest.raises(ElfError, match="image library refused"):
        Agent(AgentConfig(library=image.library, host_root=host.root, sha256=sha(image.library)))
    assert host.live.read_bytes() == vendor.read_bytes() and not host.state.exists()


@pytest.mark.watch("inotify", 30.0)
def test_status_file_and_metrics(running: Agent, image: Image, host: Host, tmp_path: Path) -> None:
    from vgpu_patch.agent.metrics import serve

    server = serve(running.snapshot, 0, "127.0.0.1")
    try:
        port = server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "\nvgpu_patch_agent_ready 1\n" in body and "# TYPE vgpu_patch_agent_reapplies_total counter" in body
        assert f'want_sha256="{image.sha256}"' in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    finally:
        server.shutdown()
    doc = json.loads((tmp_path / "run" / "agent.json").read_text())
    assert doc["ready"] and doc["want_sha256"] == image.sha256 and doc["watch"] == "inotify"


def test_the_real_command_serves_metrics_repairs_and_stops_on_sigterm(image: Image, host: Host, vendor: Path,
                                                                         tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu_patch.cli", "agent", *args(image, host, "--interval", "30", "--metrics-port",
         str(port), "--metrics-addr", "127.0.0.1", "--status-file", str(tmp_path / "agent.json"), "--json")],
        cwd=repo, env={**os.environ, "NODE_NAME": "gpu-node-7"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        def metrics() -> str:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return ""

        wait_for(lambda: "\nvgpu_patch_agent_ready 1\n" in metrics())
        hami_copy_back(vendor, host.live)
        wait_for(lambda: "\nvgpu_patch_agent_reapplies_total 1\n" in metrics() and sha(host.live) == image.sha256)
        assert host.history()[-1]["operator"] == "agent@gpu-node-7"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    doc = json.loads(out)  # --json: one document, the final status
    assert doc["reapplies"] == 1 and doc["ready"] and doc["node"] == "gpu-node-7"
    assert "reapply: /usr/local/vgpu/libvgpu.so" in err


def test_ambiguous_directory_is_an_error_not_a_guess(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    shutil.copy(vendor, host.libdir / "libvgpu.so.2.4.0")
    shutil.copy(vendor, host.libdir / "libvgpu.so.2.5.0")
    status_file = tmp_path / "status.json"
    res = CliRunner().invoke(cli, args(image, host, "--once", "--status-file", str(status_file)))
    assert res.exit_code != 0 and "several versioned libraries" in str(res.exception)
    doc = json.loads(status_file.read_text())
    assert doc["state"] == "error" and doc["errors"] == 1 and not doc["ready"]
    assert all(sha(p) == sha(vendor) for p in host.libdir.glob("libvgpu.so*")) and host.history() == []


SSH_STACK = ("paramiko", "cryptography", "bcrypt", "nacl", "invoke")  # the image leaves them out (~25 MB)
_BLOCK = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SSH_STACK!r}:
            raise ImportError(f"the agent image has no {{name}}")
sys.meta_path.insert(0, Block())
from vgpu_patch.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in {SSH_STACK!r})
    print("LOADED", loaded, file=sys.stderr)
    raise
"""


@pytest.mark.parametrize("mode", [["--once", "--json"], ["--probe"], ["--rollback", "--json"], ["--help"]])
def test_the_agent_runs_without_the_ssh_stack(mode: list[str], image: Image, host: Host, tmp_path: Path) -> None:
    """deploy/Dockerfile installs the tool without paramiko and its crypto: the agent must never import them."""
    import subprocess
    import sys

    if mode[0] != "--once":  # probe and rollback act on an installed library
        assert CliRunner().invoke(cli, args(image, host, "--once", "--status-file", str(tmp_path / "s"))).exit_code == 0
    argv = ["agent", *args(image, host, *mode, "--status-file", str(tmp_path / "status.json"))]
    out = subprocess.run([sys.executable, "-c", _BLOCK, *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stderr
