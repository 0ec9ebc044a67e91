"""Habits operators bring from ssh, Ansible and kubectl: -i vs -I, -v, -T/--timeout, one exit-code rule."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpu_patch.errors import DeployError
from vgpu_patch.transport.local import LocalTransport

ROOT = Path(__file__).resolve().parents[1]


def vgpu(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def hosts_ini(tmp_path: Path) -> Path:
    p = tmp_path / "hosts.ini"
    p.write_text("[gpu]\ngpu-node-1 ansible_host=192.0.2.1\n")
    return p


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    (root / "usr/local/vgpu").mkdir(parents=True)
    return root


def test_ansibles_dash_i_gets_a_hint_for_dash_capital_i(hosts_ini: Path) -> None:
    """`-i hosts.ini -l gpu`, as Ansible is typed: -i is ssh's identity here; the error names -I."""
    out = vgpu("status", "-i", str(hosts_ini), "-l", "gpu")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "--limit needs --inventory (-I FILE)" in line and f"use `-I {hosts_ini}`" in line
    alone = vgpu("status", "-i", str(hosts_ini))
    assert alone.returncode == 2 and f"use `-I {hosts_ini}`" in alone.stderr
    with_host = vgpu("status", "--host", "admin@192.0.2.1", "-i", str(hosts_ini))
    assert with_host.returncode == 2 and "looks like an inventory, not a private key" in with_host.stderr


def test_a_private_key_given_with_dash_i_is_not_flagged(tmp_path: Path, node: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n[not a real key]\n-----END OPENSSH PRIVATE KEY-----\n")
    out = vgpu("status", "--local", str(node), "-i", str(key), "--json")
    assert out.returncode == 1 and "inventory" not in out.stderr  # 1: a node without a library, not a usage error


def test_verbose_logs_each_node_command_with_its_time_on_stderr(node: Path) -> None:
    out = vgpu("status", "--local", str(node), "-v", "--json")
    json.loads(out.stdout)  # stdout stays one document
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("vgpu-patch: debug:")]
    assert any(f"local:{node}: run (sudo): " in ln and "-vv shows all" in ln for ln in lines), out.stderr
    assert any(f"local:{node}: run (sudo) exit 0 in " in ln for ln in lines), out.stderr
    whole = vgpu("status", "--local", str(node), "-vv", "--debug")
    assert len(whole.stderr.splitlines()) > len(out.stderr.splitlines()) + 10  # the whole script
    assert "debug" not in vgpu("status", "--local", str(node)).stderr


def test_command_timeout_replaces_each_commands_own_limit() -> None:
    t = LocalTransport("/")
    t.command_timeout = 0.5
    start = time.monotonic()
    with pytest.raises(DeployError, match=r"timed out after 0.5s"):
        t.run("sleep 5", timeout=300)
    assert time.monotonic() - start < 4


def test_timeout_bounds_a_node_that_never_answers(tmp_path: Path) -> None:
    """-T 1 against a port that accepts and then says nothing (no SSH banner): the node fails in about 1 s."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # the kernel completes the handshake; nobody ever speaks
        port = listener.getsockname()[1]
        start = time.monotonic()
        out = vgpu("status", "--host", f"nobody@127.0.0.1:{port}", "--known-hosts", str(tmp_path / "kh"),
                   "-T", "1", "--json", "-v", timeout=60)
        took = time.monotonic() - start
    assert out.returncode == 1, out.stderr
    (n,) = json.loads(out.stdout)["nodes"]
    assert "cannot connect" in n["error"], n
    assert took < 10  # the default would be 15 s of waiting for the banner
    assert f"nobody@127.0.0.1:{port}: connect: nobody@127.0.0.1:{port} (timeout 1 s)" in out.stderr
    assert f"nobody@127.0.0.1:{port}: connect failed: " in out.stderr


@pytest.mark.parametrize("argv", [
    ["check", "/nonexistent/libvgpu.so"],
    ["check", str(ROOT / "pyproject.toml"), "--vendor", "/nonexistent/vendor.so"],
    ["deploy", "--local", "/tmp", "/nonexistent/libvgpu.so"],
])
def test_a_named_file_that_does_not_exist_is_a_usage_error_everywhere(argv: list[str]) -> None:
    out = vgpu(*argv)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("vgpu-patch: error: ") and "/nonexistent/" in line and "does not exist" in line


def test_a_malformed_rollback_target_is_a_usage_error_before_any_node(node: Path) -> None:
    out = vgpu("rollback", "--local", str(node), "--to", "abc", "--yes", "--json")
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"].startswith("--to abc: give previous, vendor, or at least 6 hex digits")
    assert not (node / "usr/local/vgpu/.vgpu-patch").exists()  # nothing was touched


def test_a_file_that_exists_but_is_wrong_is_a_failure(tmp_path: Path) -> None:
    bad = tmp_path / "libvgpu.so"
    bad.write_text("not an ELF file")
    assert vgpu("check", str(bad)).returncode == 1
