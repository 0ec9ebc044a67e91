"""Habits operators bring from ssh, Ansible and kubectl: -i vs -I, -v, -T/--timeout, one exit-code rule."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpu_patch.cli import COMMANDS
from vgpu_patch.report.errors import DeployError
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


def _subcommands(name: str) -> list[tuple[str, object]]:
    import click

    from vgpu_patch.cli import cli

    cmd = cli.get_command(click.Context(cli), name)
    assert cmd is not None
    found: list[tuple[str, object]] = [(name, cmd)]
    if isinstance(cmd, click.Group):
        found += [(f"{name} {sub}", cmd.commands[sub]) for sub in cmd.commands]
    return found


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_takes_dash_v_after_and_before_it(name: str) -> None:
    """`vgpu-patch CMD -v` and `vgpu-patch -v CMD` on every command (and subcommand), as docs/first-node.md says."""
    for full, cmd in _subcommands(name):
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}  # type: ignore[attr-defined]
        assert {"-v", "--verbose", "--debug"} <= opts, f"vgpu-patch {full} has no -v/--verbose"
        words = full.split()
        for argv in ([*words, "-v", "--help"], ["-v", *words, "--help"], ["-vv", *words, "-v", "--help"]):
            out = vgpu(*argv)
            assert out.returncode == 0 and "--verbose" in out.stdout, (argv, out.stderr)


def test_dash_v_before_and_after_add_up_and_never_outlive_their_run() -> None:
    """-v before the command and after it add up (-v CMD -v is -vv), and one run's level never leaks into the
    next one in the same process."""
    from click.testing import CliRunner

    from vgpu_patch.cli import cli
    from vgpu_patch.report import verbosity

    runner = CliRunner()
    for argv, level in ((["-v", "check", "-v", "/bin/true"], 2), (["check", "/bin/true"], 0),
                        (["-v", "check", "/bin/true"], 1), (["check", "-vv", "/bin/true"], 2)):
        res = runner.invoke(cli, argv)
        assert res.exit_code == 4 and verbosity.level() == level, (argv, res.output)
        debug = [ln for ln in res.stderr.splitlines() if ln.startswith("vgpu-patch: debug:")]
        assert bool(debug) == bool(level) and all("check: read the candidate /bin/true" in ln for ln in debug)
    verbosity.set_level(0)


@pytest.mark.parametrize("argv", [
    ["daemonset", "--image", "registry.example.com/vgpu-patch-agent:0.1.0"],
    ["check", "/bin/true"],
    ["region", "show", "REGION"],
])
def test_dash_v_logs_what_the_command_does(argv: list[str], tmp_path: Path) -> None:
    from vgpu_patch.shim import region as R

    region = tmp_path / "r.cache"
    region.write_bytes(R.encode(uuids=["GPU-x"], limit=[1 << 30]))
    argv = [str(region) if a == "REGION" else a for a in argv]
    for where in ("before", "after"):
        out = vgpu(*(["-v", *argv] if where == "before" else [*argv, "-v"]))
        debug = [ln for ln in out.stderr.splitlines() if ln.startswith("vgpu-patch: debug:")]
        assert debug and f"{argv[0]}: " in debug[0], (where, out.stderr)
        assert not [ln for ln in vgpu(*argv).stderr.splitlines() if "debug" in ln]
