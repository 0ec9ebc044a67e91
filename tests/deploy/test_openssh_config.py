"""OpenSSH's client config and known_hosts as OpenSSH reads them, over real sshd on 127.0.0.1:
ProxyCommand through a bastion (a second sshd), HostKeyAlias, ConnectTimeout, GlobalKnownHostsFile,
@revoked and @cert-authority lines, hashed names."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from deploy_support import NO_SUDO, build_lib
from sshd_harness import SSHD

from vgpu_patch.cli import cli
from vgpu_patch.deploy.targets import SSHSettings, make_transport, parse_host
from vgpu_patch.report.errors import ConnectionFailure, HostKeyError
from vgpu_patch.transport.known_hosts import KnownHosts


def _lib_dir(tmp_path: Path, lib: Path) -> Path:
    d = tmp_path / "lib dir: spaced"  # a space and a colon in every path on the node
    d.mkdir()
    tmp_path.chmod(0o755)
    (d / "libvgpu.so").write_bytes(lib.read_bytes())
    return d


def _accepted(server: SSHD) -> int:
    return server.log_path.read_text(errors="replace").count("Accepted publickey")


def _key_blob(server: SSHD) -> str:
    return server.host_key_line.split()[2]


def test_proxycommand_through_a_bastion_is_used(sshd_root: SSHD, fresh_sshd: SSHD, tmp_path: Path, libs) -> None:
    """The node's HostName does not resolve: only the bastion's `ssh -W` can reach it."""
    d = _lib_dir(tmp_path, libs["vendor"])
    kh = tmp_path / "known_hosts"
    kh.write_text(f"gpu-behind ssh-ed25519 {_key_blob(fresh_sshd)}\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host gpu-behind\n  HostName gpu-behind.invalid\n  Port {fresh_sshd.port}\n  User {fresh_sshd.user}\n"
        f"  IdentityFile {fresh_sshd.key_path}\n  HostKeyAlias gpu-behind\n  UserKnownHostsFile {kh}\n"
        f"  ProxyCommand ssh -F {sshd_root.ssh_config_path} {sshd_root.alias} -W 127.0.0.1:%p\n"
    )
    bastion_before, node_before = _accepted(sshd_root), _accepted(fresh_sshd)
    res = CliRunner().invoke(cli, ["deploy", "--no-check", *NO_SUDO, "--host", "gpu-behind", "--ssh-config", str(cfg),
                                   "--target-dir", str(d), "--json", str(libs["v1"])])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["nodes"][0]["status"] == "changed"
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    assert _accepted(sshd_root) == bastion_before + 1  # the bastion carried the connection
    assert _accepted(fresh_sshd) >= node_before + 1


def test_connect_timeout_from_ssh_config(tmp_path: Path) -> None:
    silent = socket.socket()  # accepts, never says a word (no SSH banner)
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host mute\n  HostName 127.0.0.1\n  Port {silent.getsockname()[1]}\n  ConnectTimeout 1\n")
    t = make_transport(parse_host("mute"), config=SSHSettings(config=str(cfg)))
    start = time.monotonic()
    try:
        with pytest.raises(ConnectionFailure) as e:
            t.run("true")
    finally:
        silent.close()
    assert time.monotonic() - start < 8 and "cannot connect" in str(e.value) and "\n" not in str(e.value)


def _transport(server: SSHD, tmp_path: Path, user_kh: str, global_kh: Path | None = None):
    cfg = tmp_path / "cfg"
    lines = [f"Host n\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}",
             f"  IdentityFile {server.key_path}\n  UserKnownHostsFile {user_kh}"]
    if global_kh is not None:
        lines.append(f"  GlobalKnownHostsFile {global_kh}")
    cfg.write_text("\n".join(lines) + "\n")
    sudo = None if os.geteuid() == 0 else False
    t = make_transport(parse_host("n"), config=SSHSettings(config=str(cfg)), use_sudo=sudo)
    t.allow_agent = False  # type: ignore[attr-defined]
    return t


def test_global_known_hosts_file_is_read(sshd_root: SSHD, tmp_path: Path) -> None:
    g = tmp_path / "ssh_known_hosts"
    g.write_text(sshd_root.host_key_line + "\n")
    with _transport(sshd_root, tmp_path, str(tmp_path / "empty"), g) as t:
        assert t.run("echo ok").stdout == "ok\n"
    assert not (tmp_path / "empty").exists()  # nothing was written: the key was known


def test_marker_lines_do_not_break_connections_and_revoked_keys_are_refused(sshd_root: SSHD, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    kh.write_text(
        f"@cert-authority *.example.com ssh-ed25519 {other}\n"
        f"@revoked badhost ssh-ed25519 {other}\n"
        "garbage line\n"
        f"{sshd_root.host_key_line}\n"
    )
    with _transport(sshd_root, tmp_path, str(kh)) as t:  # the marker lines are skipped, not fatal
        assert t.run("echo ok").stdout == "ok\n"
    kh.write_text(f"@revoked * ssh-ed25519 {_key_blob(sshd_root)}\n{sshd_root.host_key_line}\n")
    with pytest.raises(HostKeyError) as e:
        _transport(sshd_root, tmp_path, str(kh)).run("true")
    assert "@revoked" in str(e.value) and f"{kh}:1" in str(e.value) and "\n" not in str(e.value)


def test_unknown_key_under_a_cert_authority_is_refused_with_a_hint(sshd_root: SSHD, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority [127.0.0.1]:* ssh-ed25519 {_key_blob(sshd_root)}\n")
    with pytest.raises(HostKeyError) as e:
        _transport(sshd_root, tmp_path, str(kh)).run("true")
    msg = str(e.value)
    assert "unknown host key" in msg and "@cert-authority" in msg and "--accept-new-host-keys" in msg


def test_hashed_known_hosts_names(sshd_root: SSHD, tmp_path: Path) -> None:
    salt = os.urandom(20)
    name = f"[127.0.0.1]:{sshd_root.port}"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    hashed = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{hashed} ssh-ed25519 {_key_blob(sshd_root)}\n")
    assert KnownHosts.load([str(kh)]).for_host(name)
    with _transport(sshd_root, tmp_path, str(kh)) as t:
        assert t.run("echo ok").stdout == "ok\n"


def test_partial_upload_is_private_and_removed_when_the_link_is_cut(sshd_root: SSHD, tmp_path: Path, libs) -> None:
    """The upload is created 0600; a link cut mid-upload leaves no partial file behind (one re-dial removes it)."""
    from deploy_tcpproxy import CuttingProxy

    from vgpu_patch.deploy import swap
    from vgpu_patch.deploy.request import SwapHooks
    from vgpu_patch.transport.ssh import SSHTransport

    d = _lib_dir(tmp_path, libs["vendor"])
    big = build_lib(tmp_path / "big.so", 8, pad=4 * 1024 * 1024)
    before = set(Path(swap.UPLOAD_DIR).glob(".vgpu-patch-upload-*"))
    modes: list[int] = []
    for cut_after in (300 * 1024, 1024 * 1024, 2 * 1024 * 1024):
        proxy = CuttingProxy(sshd_root.port, cut_after=cut_after, once=True)
        known = tmp_path / "kh"
        known.write_text(sshd_root.host_key_line.replace(str(sshd_root.port), str(proxy.port), 1) + "\n")

        def watch(proxy: CuttingProxy = proxy) -> None:  # the mode of the partial file, while it is written
            while not proxy.cut.is_set():
                for p in set(Path(swap.UPLOAD_DIR).glob(".vgpu-patch-upload-*")) - before:
                    with contextlib.suppress(FileNotFoundError):
                        modes.append(p.stat().st_mode & 0o777)
                time.sleep(0.002)

        import threading

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t = SSHTransport("127.0.0.1", port=proxy.port, user=sshd_root.user, key_filenames=[str(sshd_root.key_path)],
                         known_hosts=known, allow_agent=False, use_sudo=None if os.geteuid() == 0 else False)
        try:
            with pytest.raises(ConnectionFailure):
                swap.deploy_file(t, big, str(d), operator="x")
            assert proxy.cut.is_set()
        finally:
            t.close()
            proxy.stop()
            watcher.join(5)
        assert set(Path(swap.UPLOAD_DIR).glob(".vgpu-patch-upload-*")) - before == set(), f"cut at {cut_after}"
        assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert set(modes) <= {0o600}  # whatever the watcher caught mid-upload was private
    seen: list[int] = []  # and deterministically: the whole upload, just before the swap script uses it
    hooks = SwapHooks(after_upload=lambda p: seen.append(os.stat(p).st_mode & 0o777))
    with SSHTransport("127.0.0.1", port=sshd_root.port, user=sshd_root.user, key_filenames=[str(sshd_root.key_path)],
                      known_hosts=sshd_root.known_hosts, allow_agent=False,
                      use_sudo=None if os.geteuid() == 0 else False) as t:
        assert swap.deploy_file(t, big, str(d), operator="x", hooks=hooks).changed
    assert seen == [0o600]
