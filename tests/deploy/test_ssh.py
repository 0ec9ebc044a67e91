"""The protocol over real OpenSSH sshd on 127.0.0.1: root and sudo logins, host keys, broken links, ProxyJump."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from deploy_support import IS_ROOT, NO_SUDO, assert_whole, build_lib, leftovers, leftovers_after_exit, sha
from deploy_tcpproxy import CuttingProxy
from sshd_harness import SSHD, known_hosts_file

from vgpu_patch.cli import cli
from vgpu_patch.deploy.swap import deploy_file, node_status, rollback
from vgpu_patch.deploy.targets import make_transport, parse_host
from vgpu_patch.report.errors import AuthFailure, ConnectionFailure, HostKeyError
from vgpu_patch.transport.ssh import SSHTransport


def transport(server: SSHD, **kw) -> SSHTransport:
    kw.setdefault("known_hosts", server.known_hosts)
    kw.setdefault("use_sudo", None if IS_ROOT else False)
    return SSHTransport(server.host, port=server.port, user=server.user, key_filenames=[str(server.key_path)],
                        allow_agent=False, **kw)


def lib_dir(tmp_path: Path, lib: Path | None, name: str = "vgpu") -> Path:
    d = tmp_path / name
    d.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    if lib is not None:
        shutil.copyfile(lib, d / "libvgpu.so")
        (d / "libvgpu.so").chmod(0o644)
    return d


def test_root_login_deploy_status_rollback(sshd_root: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    with transport(sshd_root) as t:
        r = deploy_file(t, libs["v1"], str(d), operator="ssh-test")
        assert r.changed and (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
        assert not deploy_file(t, libs["v1"], str(d), operator="ssh-test").changed
        st = node_status(t, str(d))
        assert st.ours and st.sha256 == sha(libs["v1"]) and len(st.backups) == 1
        rollback(t, str(d), operator="ssh-test")
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert leftovers(d) == []


def test_sudo_user_with_requiretty(sshd_sudo: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    d.chmod(0o755)  # root-owned: the login user cannot write here, only sudo can
    with transport(sshd_sudo) as t:
        assert t.run("id -u").stdout.strip() != "0"
        assert t.run("id -u", sudo=True).stdout.strip() == "0"
        r = deploy_file(t, libs["v2"], str(d), operator="sudo-test")
        assert r.changed
        st = node_status(t, str(d))
        assert st.version == "0.2.0"
        r = rollback(t, str(d), operator="sudo-test")
        assert r.changed
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert (d / "libvgpu.so").stat().st_uid == 0
    assert leftovers(d) == []


def test_sudo_refused_is_auth_failure(sshd_nosudo: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    with transport(sshd_nosudo) as t, pytest.raises(AuthFailure, match="sudo refused"):
        deploy_file(t, libs["v1"], str(d), operator="x")
    assert_whole(d / "libvgpu.so", libs["vendor"])


def test_unknown_host_key_refused_then_accepted(sshd_root: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    kh = tmp_path / "known_hosts"
    with pytest.raises(HostKeyError) as e:
        transport(sshd_root, known_hosts=kh).run("true")
    msg = str(e.value)
    assert sshd_root.host_key_fingerprint in msg and "--accept-new-host-keys" in msg and "\n" not in msg
    assert not kh.exists()
    with transport(sshd_root, known_hosts=kh, accept_new_host_keys=True) as t:
        assert t.run("echo hi").stdout == "hi\n"
    assert f"[127.0.0.1]:{sshd_root.port} ssh-ed25519" in kh.read_text()
    with transport(sshd_root, known_hosts=kh) as t:  # now known: no flag needed
        assert deploy_file(t, libs["v1"], str(d), operator="x").changed


def test_no_key_and_no_agent_says_how_to_give_a_key(sshd_root: SSHD, tmp_path: Path, monkeypatch) -> None:
    """No -i, no IdentityFile, nothing in ~/.ssh and no agent: an authentication problem (exit 1, one line that
    says how to offer a key), not a network one."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    res = CliRunner().invoke(cli, ["status", "--host", sshd_root.target, "--known-hosts", str(sshd_root.known_hosts),
                                   "--target-dir", str(tmp_path), "--json"])
    assert res.exit_code == 1, res.output
    detail = json.loads(res.stdout)["nodes"][0]["error"]
    assert detail == (f"{sshd_root.target}: no SSH key was offered for {sshd_root.user} (no -i, no IdentityFile, "
                      "no default key in ~/.ssh, no ssh-agent (SSH_AUTH_SOCK unset)); give one with -i KEY, "
                      "IdentityFile in ~/.ssh/config or the inventory's ansible_ssh_private_key_file, or load it "
                      "with ssh-add")
    assert "network" not in res.output


def test_changed_host_key_always_refused(fresh_sshd: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    old = fresh_sshd.host_key_fingerprint
    fresh_sshd.rotate_host_key()  # known_hosts keeps the old key
    for accept in (False, True):
        with pytest.raises(HostKeyError, match="CHANGED"):
            transport(fresh_sshd, accept_new_host_keys=accept).run("true")
    assert_whole(d / "libvgpu.so", libs["vendor"])
    # through the CLI with --known-hosts: the hint is the exact command, [host]:port quoted, that file named
    kh = fresh_sshd.known_hosts
    res = CliRunner().invoke(cli, ["status", "--host", fresh_sshd.target, "--known-hosts", str(kh), "--json",
                                   "--target-dir", str(d)])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["nodes"][0]["error"] == (
        f"{fresh_sshd.target}: host key CHANGED (got {fresh_sshd.host_key_fingerprint}, {kh} has {old}); refusing: "
        f"possible impersonation. If the node was reinstalled, verify its new key, then remove the old one: "
        f"ssh-keygen -R '[127.0.0.1]:{fresh_sshd.port}' -f {kh}")
    # run as printed, it removes exactly that line: the node is then unknown, not changed
    cmd = json.loads(res.stdout)["nodes"][0]["error"].rsplit(": ", 1)[1]
    subprocess.run(["sh", "-c", cmd], check=True, capture_output=True)
    with pytest.raises(HostKeyError, match="unknown host key"):
        transport(fresh_sshd).run("true")


def test_forget_command_forms(tmp_path: Path, monkeypatch) -> None:
    from vgpu_patch.transport.ssh import forget_command

    monkeypatch.setenv("HOME", str(tmp_path))
    default = str(tmp_path / ".ssh" / "known_hosts")
    assert forget_command("gpu-node-1", [default]) == "ssh-keygen -R gpu-node-1"  # ssh's own file: no -f
    assert forget_command("[10.0.0.7]:2222", [default, "/etc/ssh/ssh_known_hosts"]) == (
        "ssh-keygen -R '[10.0.0.7]:2222' && ssh-keygen -R '[10.0.0.7]:2222' -f /etc/ssh/ssh_known_hosts")
    assert forget_command("n1", ["my hosts"]) == "ssh-keygen -R n1 -f 'my hosts'"


def test_connection_cut_mid_upload_leaves_old_file(sshd_root: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    big = build_lib(tmp_path / "big.so", 5, pad=4 * 1024 * 1024)
    # the probe and handshake are a few KiB: the cut lands inside the 4 MiB upload
    proxy = CuttingProxy(sshd_root.port, cut_after=1024 * 1024)
    known = tmp_path / "kh"
    known.write_text(sshd_root.host_key_line.replace(str(sshd_root.port), str(proxy.port), 1) + "\n")
    try:
        t = SSHTransport("127.0.0.1", port=proxy.port, user=sshd_root.user, key_filenames=[str(sshd_root.key_path)],
                         known_hosts=known, allow_agent=False, use_sudo=None if IS_ROOT else False)
        with pytest.raises(ConnectionFailure, match="connection lost"):
            deploy_file(t, big, str(d), operator="x")
        assert proxy.cut.is_set()
        t.close()
    finally:
        proxy.stop()
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert leftovers_after_exit(d) == []
    with transport(sshd_root) as t:  # a rerun over a good link completes
        assert deploy_file(t, big, str(d), operator="x").changed
    assert_whole(d / "libvgpu.so", big)


def test_sessions_killed_mid_upload(fresh_sshd: SSHD, tmp_path: Path, libs) -> None:
    """sshd's per-connection process is SIGKILLed while the upload runs."""
    d = lib_dir(tmp_path, libs["vendor"])
    big = build_lib(tmp_path / "big.so", 6, pad=16 * 1024 * 1024)
    from vgpu_patch.deploy import swap

    real_put = SSHTransport.put
    killed = []

    def put_and_kill(self, local, remote):  # type: ignore[no-untyped-def]
        import threading
        import time

        def killer() -> None:
            time.sleep(0.05)
            killed.append(fresh_sshd.kill_sessions())

        threading.Thread(target=killer).start()
        return real_put(self, local, remote)

    t = transport(fresh_sshd)
    SSHTransport.put = put_and_kill  # type: ignore[method-assign]
    try:
        with pytest.raises(ConnectionFailure):
            swap.deploy_file(t, big, str(d), operator="x")
    finally:
        SSHTransport.put = real_put  # type: ignore[method-assign]
        t.close()
    assert killed and killed[0] >= 1
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert leftovers(d) == []


def test_proxyjump_from_ssh_config(sshd_root: SSHD, fresh_sshd: SSHD, tmp_path: Path, libs) -> None:
    d = lib_dir(tmp_path, libs["vendor"])
    kh = known_hosts_file([sshd_root, fresh_sshd], tmp_path / "known_hosts")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {sshd_root.port}\n  User {sshd_root.user}\n"
        f"  IdentityFile {sshd_root.key_path}\n"
        f"Host gpu-behind\n  HostName 127.0.0.1\n  Port {fresh_sshd.port}\n  User {fresh_sshd.user}\n"
        f"  IdentityFile {fresh_sshd.key_path}\n  ProxyJump jumpbox\n"
    )
    accepted = lambda srv: srv.log_path.read_text().count("Accepted publickey")  # noqa: E731
    jump_before, target_before = accepted(sshd_root), accepted(fresh_sshd)
    res = CliRunner().invoke(
        cli, ["deploy", "--no-check", *NO_SUDO, "--host", "gpu-behind", "--ssh-config", str(cfg),
              "--known-hosts", str(kh), "--target-dir", str(d), "--json", str(libs["v1"])],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["nodes"][0]["status"] == "changed" and doc["nodes"][0]["node"] == "gpu-behind"
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    # one login on the jump host, one on the node behind it
    assert accepted(sshd_root) == jump_before + 1 and accepted(fresh_sshd) == target_before + 1


def test_make_transport_resolves_ssh_config(tmp_path: Path) -> None:
    from vgpu_patch.deploy.targets import SSHSettings

    key = tmp_path / "k"
    key.write_text("not used\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host n1\n  HostName 10.1.2.3\n  Port 2222\n  User ops\n  IdentityFile {key}\n"
                   f"  ConnectTimeout 7\n  UserKnownHostsFile {tmp_path}/kh1 {tmp_path}/kh2\n")
    t = make_transport(parse_host("n1"), config=SSHSettings(config=str(cfg)))
    assert (t.hostname, t.port, t.user) == ("10.1.2.3", 2222, "ops")  # type: ignore[attr-defined]
    assert t.key_filenames == [str(key)]  # type: ignore[attr-defined]
    assert t.connect_timeout == 7.0  # type: ignore[attr-defined]
    assert t.user_known_hosts == [f"{tmp_path}/kh1", f"{tmp_path}/kh2"]  # type: ignore[attr-defined]
    assert "/etc/ssh/ssh_known_hosts" in t.global_known_hosts  # type: ignore[attr-defined]
    t = make_transport(parse_host("admin@n1:22"), config=SSHSettings(config=str(cfg)))
    assert (t.port, t.user) == (22, "admin")  # type: ignore[attr-defined]


@pytest.mark.parametrize("children", [True, False], ids=["script-killed", "script-orphaned"])
def test_connection_killed_during_the_swap_script(fresh_sshd: SSHD, tmp_path: Path, libs, children: bool,
                                                 request: pytest.FixtureRequest) -> None:
    import threading
    import time

    from vgpu_patch.deploy import swap
    from vgpu_patch.deploy.request import SwapHooks
    from vgpu_patch.report.errors import LockedError

    d = lib_dir(tmp_path, libs["vendor"])
    marker = tmp_path / "in-lock"
    # the background sleep exists before the marker does, so a kill of the whole session reaches it
    hooks = SwapHooks(in_lock=f"(sleep 1.5) & : > {marker}; wait")

    def kill_when_locked() -> None:
        for _ in range(400):
            if marker.exists():
                break
            time.sleep(0.025)
        fresh_sshd.kill_sessions(children=children)

    killer = threading.Thread(target=kill_when_locked)
    killer.start()
    t = transport(fresh_sshd)
    uploads = Path(swap.UPLOAD_DIR)
    before = set(uploads.glob(".vgpu-patch-upload-*"))

    def remove_own_upload() -> None:
        # Killed with its children, the script never removes its upload; a later run sweeps it only once it is
        # 5 minutes old (a younger one may be another controller's, mid-deploy): this test's own goes at its end.
        for left in set(uploads.glob(f".vgpu-patch-upload-{sha(libs['v1'])[:12]}-*")) - before:
            left.unlink(missing_ok=True)

    request.addfinalizer(remove_own_upload)
    try:
        with pytest.raises(ConnectionFailure):
            deploy_file(t, libs["v1"], str(d), operator="x", hooks=hooks)
    finally:
        killer.join()
        t.close()
    assert marker.exists()
    history = d / ".vgpu-patch" / "history.jsonl"
    if not children:  # the orphaned script ignores HUP/PIPE and completes the swap on its own
        for _ in range(200):
            if history.exists():
                break
            time.sleep(0.05)
        assert history.exists()
        assert_whole(d / "libvgpu.so", libs["v1"])
    else:
        assert_whole(d / "libvgpu.so", libs["vendor"], libs["v1"])
    with transport(fresh_sshd) as t2:  # the lock died with the script: a rerun goes through
        for _ in range(40):
            try:
                deploy_file(t2, libs["v1"], str(d), operator="x")
                break
            except LockedError:  # an orphan still finishing
                time.sleep(0.1)
        assert node_status(t2, str(d)).sha256 == sha(libs["v1"])
    assert leftovers(d) == []  # the rerun removed whatever a SIGKILLed script left


def test_status_over_ssh_counts_processes_on_the_old_library(sshd_sudo: SSHD, tmp_path: Path, libs) -> None:
    """Reading other processes' maps needs root: the sudo path must see a root-owned process."""
    import subprocess
    import sys

    d = lib_dir(tmp_path, libs["vendor"])
    child = subprocess.Popen(
        [sys.executable, "-c", "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); print('ready', flush=True); "
         "sys.stdin.readline(); print(lib.vgpu_test_version())", str(d / "libvgpu.so")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        with transport(sshd_sudo) as t:
            r = deploy_file(t, libs["v1"], str(d), operator="x", stale=True)
            assert child.pid in r.stale_pids
            st = node_status(t, str(d))
            assert child.pid in st.stale_pids and st.sha256 == sha(libs["v1"])
        out, _ = child.communicate("go\n", timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0 and out.strip() == "7"  # still running the old (vendor) code, no SIGBUS


def test_yaml_inventory_and_limit_through_the_cli(sshd_root: SSHD, fresh_sshd: SSHD, tmp_path: Path, libs) -> None:
    from sshd_harness import inventory_yaml

    d = lib_dir(tmp_path, libs["vendor"])
    inv = inventory_yaml([sshd_root, fresh_sshd], tmp_path / "hosts.yml", group="gpu")
    kh = known_hosts_file([sshd_root, fresh_sshd], tmp_path / "known_hosts")
    res = CliRunner().invoke(cli, ["deploy", "--no-check", *NO_SUDO, "-I", str(inv), "--limit", fresh_sshd.alias,
                                   "--known-hosts", str(kh), "--target-dir", str(d), "--json", str(libs["v2"])])
    assert res.exit_code == 0, res.output
    nodes = json.loads(res.stdout)["nodes"]
    assert [n["node"] for n in nodes] == [fresh_sshd.alias] and nodes[0]["status"] == "changed"
    assert (d / "libvgpu.so").read_bytes() == libs["v2"].read_bytes()


@pytest.mark.parametrize("pty", [True, False], ids=["pty", "no-pty"])
def test_password_sudo_through_the_fixed_prompt(tmp_path: Path, libs, pty: bool) -> None:
    from sshd_harness import HarnessUnavailable, require_root

    require_root()
    try:
        server = SSHD(tmp_path / "sshd", user="vgpupwsudo", create_user=True, sudo_password="s3cret pass")
    except HarnessUnavailable as e:
        pytest.skip(str(e))
    d = lib_dir(tmp_path, libs["vendor"])
    with server:
        with pytest.raises(AuthFailure, match="--ask-become-pass"):  # no password: sudo -n refuses, says how
            transport(server, use_sudo=None).run("id -u", sudo=True)
        with transport(server, use_sudo=None, become_password="s3cret pass", pty_for_sudo=pty) as t:
            res = t.run("id -u", sudo=True)
            assert res.stdout == "0\n" and "s3cret" not in res.stdout + res.stderr  # never echoed
            assert deploy_file(t, libs["v1"], str(d), operator="pw").changed
        with pytest.raises(AuthFailure, match=r"rejected the password|sudo refused"):
            transport(server, use_sudo=None, become_password="wrong", pty_for_sudo=pty).run("true", sudo=True)
        if pty:  # through the CLI: -K asks once (hidden, on stderr), then sudo's prompt on the node is answered
            res = CliRunner().invoke(cli, ["deploy", "--no-check", "-K", "--host", server.target,
                                           "-i", str(server.key_path), "--known-hosts", str(server.known_hosts),
                                           "--target-dir", str(d), "--json", str(libs["v2"])],
                                     input="s3cret pass\n")
            assert res.exit_code == 0, res.output
            assert json.loads(res.stdout[res.stdout.index("{"):])["nodes"][0]["status"] == "changed"
    assert (d / "libvgpu.so").read_bytes() == libs["v2" if pty else "v1"].read_bytes()
