"""Node state an attacker (or an accident) controls: symlinks and foreign owners in .vgpu-patch/, fake
roots with absolute symlinks, undecodable history and manifests, a target path with a space or colon."""
from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from deploy_support import IS_ROOT, leftovers, make_node, sha

from vgpu_patch.deploy.request import SwapHooks
from vgpu_patch.deploy.swap import deploy_file, node_status, rollback
from vgpu_patch.report.errors import DeployError
from vgpu_patch.transport.local import LocalTransport, resolve_in_root

DIR = "/usr/local/vgpu"


def _node(tmp_path: Path, libs) -> tuple[LocalTransport, Path]:
    root = tmp_path / "root"
    return LocalTransport(root), make_node(root, libs["vendor"])


def test_symlink_in_the_state_dir_is_refused(tmp_path: Path, libs) -> None:
    t, d = _node(tmp_path, libs)
    deploy_file(t, libs["v1"], DIR, operator="a")
    victim = tmp_path / "secret"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    hist = d / ".vgpu-patch" / "history.jsonl"
    hist.unlink()
    hist.symlink_to(victim)
    with pytest.raises(DeployError) as e:
        deploy_file(t, libs["v2"], DIR, operator="a")
    assert "symlink" in str(e.value) and "\n" not in str(e.value)
    assert victim.read_text() == "root only\n"  # never appended to
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    st = node_status(t, DIR)
    assert st.problem and "symlink" in st.problem and st.history == []  # status reports, never reads through it
    with pytest.raises(DeployError, match="symlink"):
        rollback(t, DIR, operator="a")


def test_state_dir_itself_a_symlink_is_refused(tmp_path: Path, libs) -> None:
    t, d = _node(tmp_path, libs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (d / ".vgpu-patch").symlink_to(elsewhere)
    with pytest.raises(DeployError, match="symlink"):
        deploy_file(t, libs["v1"], DIR, operator="a")
    assert list(elsewhere.iterdir()) == []
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()


@pytest.mark.skipif(not IS_ROOT, reason="the ownership rule applies when running as root")
def test_state_dir_owned_by_another_user_is_refused_as_root(tmp_path: Path, libs) -> None:
    t, d = _node(tmp_path, libs)
    state = d / ".vgpu-patch"
    (state / "backups").mkdir(parents=True)
    nobody = pwd.getpwnam("nobody")
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(DeployError) as e:
        deploy_file(t, libs["v1"], DIR, operator="a")
    assert "not root's alone" in str(e.value) and "chown" in str(e.value)
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    os.chown(state, 0, 0)
    (state / "backups").chmod(0o777)  # world-writable: anyone could plant a link later
    with pytest.raises(DeployError, match="not root's alone"):
        deploy_file(t, libs["v1"], DIR, operator="a")
    (state / "backups").chmod(0o755)
    assert deploy_file(t, libs["v1"], DIR, operator="a").changed


def test_fake_root_confines_absolute_symlinks(tmp_path: Path, libs) -> None:
    """ROOT/usr/local/vgpu -> /usr/local/vgpu (absolute) means ROOT's own /usr/local/vgpu, never the host's."""
    root = tmp_path / "root"
    real = make_node(root, libs["vendor"], target="opt/vgpu")
    (root / "usr" / "local").mkdir(parents=True)
    (root / "usr" / "local" / "vgpu").symlink_to("/opt/vgpu")  # absolute, as on a real node
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "usr" / "escape").symlink_to("../../../outside")  # `..` stops at ROOT
    assert resolve_in_root(root, "/usr/local/vgpu/libvgpu.so") == str(real / "libvgpu.so")
    assert resolve_in_root(root, "/usr/escape/x") == str(root / "outside" / "x")
    assert resolve_in_root(root, "/../../etc/passwd") == str(root / "etc" / "passwd")
    t = LocalTransport(root)
    r = deploy_file(t, libs["v1"], DIR, operator="a")
    assert r.changed and (real / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    assert list(outside.iterdir()) == []


def test_undecodable_history_and_manifest_lines_are_skipped(tmp_path: Path, libs) -> None:
    t, d = _node(tmp_path, libs)
    deploy_file(t, libs["v1"], DIR, operator="a")
    hist = d / ".vgpu-patch" / "history.jsonl"
    good = hist.read_bytes()
    hist.write_bytes(b'{"action": "deploy", "operator": "\xff\xfe"}\n' + good + b"\x80garbage\n")
    manifest = d / ".vgpu-patch" / "backups" / f"{sha(libs['vendor'])}.json"
    doc = manifest.read_bytes()
    (d / ".vgpu-patch" / "backups" / ("f" * 64 + ".json")).write_bytes(b'{"sha256": "\xc3\x28"}\n')
    st = node_status(t, DIR)
    assert len(st.history) == 1 and st.history[0]["to_sha256"] == sha(libs["v1"])
    assert any("not valid UTF-8" in w for w in st.warnings)
    assert manifest.read_bytes() == doc
    r = rollback(t, DIR, operator="a")
    assert r.changed and (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert deploy_file(t, libs["v2"], DIR, operator="a").changed


def test_target_path_with_space_and_colon(tmp_path: Path, libs) -> None:
    root = tmp_path / "root"
    target = "srv/gpu node:1/lib"
    d = make_node(root, libs["vendor"], target=target)
    t = LocalTransport(root)
    r = deploy_file(t, libs["v1"], "/" + target, operator="o'brien \"q\" $(x) %s")
    assert r.changed and (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    (entry,) = [json.loads(x) for x in (d / ".vgpu-patch" / "history.jsonl").read_text().splitlines()]
    assert entry["path"] == f"/{target}/libvgpu.so" and entry["operator"] == "o'brien \"q\" $(x) %s"
    assert rollback(t, "/" + target, operator="a").changed
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert leftovers(d) == []


def test_local_upload_is_private_and_never_follows_a_link(tmp_path: Path, libs) -> None:
    t = LocalTransport(tmp_path / "root")
    (tmp_path / "root" / "tmp").mkdir(parents=True)
    t.put(libs["v1"], "/tmp/up")
    assert ((tmp_path / "root" / "tmp" / "up").stat().st_mode & 0o777) == 0o600
    (tmp_path / "root" / "tmp" / "planted").symlink_to(tmp_path / "target")  # absolute: re-rooted in ROOT
    t.put(libs["v1"], "/tmp/planted")
    assert not (tmp_path / "target").exists()
    assert (tmp_path / "root" / str(tmp_path / "target").lstrip("/")).read_bytes() == libs["v1"].read_bytes()
    with pytest.raises(DeployError, match="upload to /tmp/up failed"):  # O_EXCL: never reuses a file
        t.put(libs["v1"], "/tmp/up")


def test_status_cli_warns_about_undecodable_lines_on_stderr(tmp_path: Path, libs) -> None:
    import subprocess
    import sys

    t, d = _node(tmp_path, libs)
    deploy_file(t, libs["v1"], DIR, operator="a")
    hist = d / ".vgpu-patch" / "history.jsonl"
    hist.write_bytes(hist.read_bytes() + b"\xff\xfe not utf-8\n")
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "status", "--local", str(t.root), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nodes"][0]["result"]["sha256"] == sha(libs["v1"])
    assert "not valid UTF-8" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_ld_so_preload_symlink_is_never_read(tmp_path: Path, libs) -> None:
    t, d = _node(tmp_path, libs)
    secret = tmp_path / "secret"
    secret.write_text("/x/libvgpu-secret-token.so\n")
    (d / "ld.so.preload").symlink_to(secret)
    r = deploy_file(t, libs["v1"], DIR, operator="a")  # read, the line would refuse the deploy
    assert r.changed and "secret" not in json.dumps(r.to_dict())


class _SftpLink(LocalTransport):
    """The SFTP fallback (no one-session stream, as where sudo needs a password) over a link that can drop:
    once `down`, every command fails as over a dead SSH connection."""

    down = False

    def open_stream(self, cmd: str, *, sudo: bool = False, timeout: float | None = None) -> None:  # type: ignore[override]
        return None

    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None):  # type: ignore[no-untyped-def]
        if self.down:
            from vgpu_patch.report.errors import ConnectionFailure

            raise ConnectionFailure(f"{self.name}: connection lost")
        return super().run(cmd, sudo=sudo, warn=warn, timeout=timeout)

    def _alive(self) -> bool:
        return not self.down


@pytest.mark.parametrize("action", ["deploy", "rollback"])
def test_an_upload_a_dropped_link_left_is_swept_by_the_next_run(tmp_path: Path, libs, action: str) -> None:
    t = _SftpLink(tmp_path / "root")
    d = make_node(tmp_path / "root", libs["vendor"])
    deploy_file(t, libs["v1"], DIR, operator="a")
    up = tmp_path / "root" / "tmp"

    def drop(_: str) -> None:
        t.down = True

    with pytest.raises(DeployError, match="connection lost"):
        deploy_file(t, libs["v2"], DIR, operator="a", hooks=SwapHooks(after_upload=drop))
    (left,) = up.glob(".vgpu-patch-upload-*")  # nothing on the node could remove it: the link stayed down
    assert left.stat().st_mode & 0o777 == 0o600
    t.down = False
    fresh = up / ".vgpu-patch-upload-0123456789ab-000000000000"  # another controller's, mid-deploy: kept
    fresh.write_bytes(b"x")
    os.utime(left, (left.stat().st_atime, left.stat().st_mtime - 600))  # its swap would have run long ago
    r = deploy_file(t, libs["v2"], DIR, operator="a") if action == "deploy" else rollback(t, DIR, operator="a")
    assert r.changed
    assert sorted(p.name for p in up.glob(".vgpu-patch-upload-*")) == [fresh.name]
    assert leftovers(d) == []


@pytest.mark.parametrize("how", ["the state dir is a symlink", "a symlink inside it"])
def test_status_of_a_refused_state_dir_exits_1_with_the_reason(tmp_path: Path, libs, how: str) -> None:
    import subprocess
    import sys

    t, d = _node(tmp_path, libs)
    if how == "a symlink inside it":
        deploy_file(t, libs["v1"], DIR, operator="a")
        (d / ".vgpu-patch" / "history.jsonl").unlink()
        (d / ".vgpu-patch" / "history.jsonl").symlink_to(tmp_path / "elsewhere")
    else:
        (tmp_path / "elsewhere").mkdir()
        (d / ".vgpu-patch").symlink_to(tmp_path / "elsewhere")
    root = str(tmp_path / "root")
    p = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "status", "--local", root], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    flat = " ".join(p.stdout.replace("│", " ").split())  # the table's note cell, unfolded
    assert "is a symlink" in flat and "refusing to read or write node state through it" in flat, p.stdout
    p = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "status", "--local", root, "--json"],
                       capture_output=True, text=True, timeout=60)
    (node,) = json.loads(p.stdout)["nodes"]
    assert p.returncode == 1 and node["status"] == "failed" and "symlink" in node["error"], p.stdout
