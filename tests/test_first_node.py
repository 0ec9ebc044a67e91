"""docs/first-node.md, run as written: every line of its `sh` blocks against a real sshd on loopback.

The node is an OpenSSH server on loopback logging in the test's own user (root in CI: the sudo path, with
the guide's rule, is what tests/deploy runs over a sudo user; the rule's text is held equal to the
harness's below); its library directory holds the demo's vendor stand-in. The
operator's HOME is a temporary one: `~/.ssh/known_hosts` and the key live there, and `ssh`/`scp` on PATH
are the real clients told to use them (OpenSSH reads the home of the passwd entry, not $HOME). Only the
`kubectl` lines need a cluster and are not run. Its practice node (`bash` blocks) is run as root as written:
a user, a sudoers file and an sshd of its own, all removed by its clean-up block.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "first-node.md"


def _blocks(info: str) -> list[list[str]]:
    """The guide's fenced blocks of one kind, as command lines (backslash continuations joined)."""
    found = re.findall(rf"^```{info}\n(.*?)^```", GUIDE.read_text(), re.S | re.M)
    return [[ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()] for block in found]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_the_guides_sudoers_line_is_the_tested_rule() -> None:
    from sshd_harness import SUDO_SHELLS

    (text,) = _blocks("text")
    rule = next(ln for ln in text if not ln.startswith("#"))
    assert rule == f"admin ALL=(root) NOPASSWD: {', '.join(SUDO_SHELLS)}"


def test_first_node_guide_runs_as_written(tmp_path: Path) -> None:
    from sshd_harness import SSHD, HarnessUnavailable, available

    if available() or os.geteuid() != 0:
        pytest.skip(available() or "needs root: the node's files are root's, as on a real node")
    for tool in ("ssh", "scp", "ssh-keyscan", "ssh-keygen"):
        if not shutil.which(tool):
            pytest.skip(f"no {tool}")
    from vgpu_patch.shim_build.standin import make_vendor_standin

    # the node: its library dir (world-traversable, as /usr/local is) with the vendor stand-in
    node_root = Path(tempfile.mkdtemp(prefix="vgpu-first-node-"))
    try:
        node_root.chmod(0o755)
        lib_dir = node_root / "usr/local/vgpu"
        lib_dir.mkdir(parents=True)
        vendor = make_vendor_standin(lib_dir / "libvgpu.so")
        vendor.chmod(0o644)
        vendor_sha = _sha(vendor)
        try:
            server = SSHD(tmp_path / "sshd")
        except HarnessUnavailable as e:
            pytest.skip(str(e))
        with server:
            _run_guide(tmp_path, server, lib_dir, vendor_sha)
    finally:
        shutil.rmtree(node_root, ignore_errors=True)


def _run_guide(tmp_path: Path, server, lib_dir: Path, vendor_sha: str) -> None:  # type: ignore[no-untyped-def]
    home, work, bin_dir = tmp_path / "home", tmp_path / "work", tmp_path / "bin"
    for d in (home / ".ssh", work, bin_dir):
        d.mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    shutil.copyfile(server.key_path, key)
    key.chmod(0o600)
    opts = '-o UserKnownHostsFile="$HOME/.ssh/known_hosts" -o IdentityFile="$HOME/.ssh/id_ed25519" -o BatchMode=yes'
    for tool in ("ssh", "scp"):
        (bin_dir / tool).write_text(f'#!/bin/sh\nexec {shutil.which(tool)} {opts} "$@"\n')
    (bin_dir / "vgpu-patch").write_text(f'#!/bin/sh\nexec {sys.executable} -m vgpu_patch.cli "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "NO_COLOR": "1"}

    variables, *blocks = _blocks("sh")
    assert [ln.split("=")[0] for ln in variables] == ["NODE", "PORT", "LOGIN", "DIR"]
    values = f"NODE={server.host}; PORT={server.port}; LOGIN={server.user}; DIR={lib_dir}\n"
    lines = [ln for block in blocks for ln in block]
    not_run = [ln for ln in lines if ln.startswith("kubectl ")]
    assert len(not_run) == 2
    outputs: list[str] = []
    for line in lines:
        if line in not_run:
            continue
        m = re.search(r"#\s*exit (\d+)\s*$", line)
        want = int(m.group(1)) if m else 0
        proc = subprocess.run(["bash", "-c", values + line], cwd=work, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == want, f"{line}\nexit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        outputs.append(line + "\n" + proc.stdout)

    live = lib_dir / "libvgpu.so"
    assert (work / "vendor-libvgpu.so").read_bytes() == (lib_dir / ".vgpu-patch" / "backups" /
                                                         f"{vendor_sha}.so").read_bytes()
    assert _sha(live) == _sha(work / "out" / "libvgpu.so")  # the guide ends deployed, for step 8
    text = "\n".join(outputs)
    assert "vgpu-patch-shim 0.1.0" in text and "ours 0.1.0" in text and "vendor" in text
    assert re.search(r"^\s+1\. verify ", text, re.M)  # the dry run's numbered steps


def test_practice_node_recipe_runs_as_written(tmp_path: Path) -> None:
    """The guide's practice node, its `bash` blocks run as written (a free port for 2222, a temporary directory
    for /srv/vgpu-practice, a temporary HOME): a real sshd that logs `practice` in with the operator's key,
    sudo by the guide's line, a node directory holding the demo's vendor stand-in; then its clean-up."""
    from sshd_harness import SUDO_SHELLS, available

    if available() or os.geteuid() != 0:
        pytest.skip(available() or "needs root: it adds a user, a sudoers file and an sshd")
    if not shutil.which("visudo"):
        pytest.skip("no visudo (sudo)")
    setup, teardown = _blocks("bash")
    assert "practice ALL=(root) NOPASSWD: " + ", ".join(SUDO_SHELLS) in "\n".join(setup)
    values = re.search(r"^```\n(NODE=[^\n]*)\n```$", GUIDE.read_text(), re.M)
    assert values, "docs/first-node.md: the practice node's values block is gone"
    kv = dict(w.split("=", 1) for w in values.group(1).split())
    assert kv["NODE"] == "127.0.0.1" and kv["PORT"] == "2222" and kv["LOGIN"] == "practice"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    # not under /tmp: sshd (StrictModes) refuses an authorized_keys below a world-writable directory
    place = Path(f"/srv/vgpu-practice-test-{os.urandom(4).hex()}")
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vgpu-patch").write_text(f'#!/bin/sh\nexec {sys.executable} -m vgpu_patch.cli "$@"\n')
    (bin_dir / "vgpu-patch").chmod(0o755)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}

    def run(lines: list[str], strict: bool = True) -> None:
        script = "\n".join(["set -e" if strict else "", *lines])
        script = script.replace("/srv/vgpu-practice", str(place)).replace("2222", port)
        proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=900)
        why = f"{script}\nexit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        assert proc.returncode == 0 or not strict, why

    home.mkdir()
    ok = False
    try:
        run(setup)
        target_dir = kv["DIR"].replace("/srv/vgpu-practice", str(place))
        status = subprocess.run(
            [sys.executable, "-m", "vgpu_patch.cli", "status", "--host", f"practice@127.0.0.1:{port}",
             "--target-dir", target_dir, "-i", str(home / ".ssh" / "id_ed25519"), "--known-hosts",
             str(home / ".ssh" / "known_hosts"), "--accept-new-host-keys", "--json"],
            env=env, capture_output=True, text=True, timeout=300)
        assert status.returncode == 0, status.stdout + status.stderr
        assert '"ours": false' in status.stdout and "libvgpu.so" in status.stdout
        ok = True
    finally:
        run([ln for ln in teardown if not ln.startswith("ssh-keygen -R")], strict=ok)  # that one: the real ~/.ssh
        shutil.rmtree(place, ignore_errors=True)
    assert not place.exists() and not Path("/etc/sudoers.d/vgpu-practice").exists()
    assert subprocess.run(["id", "practice"], capture_output=True).returncode != 0
