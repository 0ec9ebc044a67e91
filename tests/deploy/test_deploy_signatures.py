"""Only signed libraries go live: `deploy --allowed-signers` refuses an unsigned, foreign-signed or changed
library with one line, before the node is touched; a library signed by an allowed key goes live, and a
rollback to a recorded backup needs no signature. Real ssh-keygen keys, a --local node root."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import make_node, sha
from signing_keys import Key, allowed_signers, make_key, sign


def vgpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Key, Key, Path]:
    d = tmp_path_factory.mktemp("keys")
    ours, theirs = make_key(d, "release@example.com"), make_key(d, "someone@elsewhere")
    return ours, theirs, allowed_signers(d / "allowed_signers", ours)


@pytest.fixture()
def case(tmp_path: Path, libs: dict[str, Path]) -> tuple[Path, Path, Path]:
    """(node root, its library dir, a candidate copy the test may sign or damage)."""
    root = tmp_path / "node"
    d = make_node(root, libs["vendor"])
    cand = tmp_path / "out" / "libvgpu.so"
    cand.parent.mkdir()
    shutil.copyfile(libs["v1"], cand)
    return root, d, cand


def refused(root: Path, cand: Path, allowed: Path) -> str:
    before = snapshot(root)
    p = vgpu("deploy", "--no-check", "--local", str(root), "--allowed-signers", str(allowed), str(cand))
    assert p.returncode == 1, p
    assert snapshot(root) == before  # nothing uploaded, backed up, locked or recorded
    assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert str(cand) in p.stderr
    return p.stderr


def test_a_missing_signature_is_refused(case, keys) -> None:
    root, _, cand = case
    assert "unsigned (no libvgpu.so.sig beside it)" in refused(root, cand, keys[2])


def test_a_key_not_allowed_is_refused(case, keys) -> None:
    root, _, cand = case
    _, theirs, allowed = keys
    sign(cand, theirs)
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", str(theirs.public)], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    assert f"signed by key {fingerprint}, which {allowed} does not allow" in refused(root, cand, allowed)


def test_a_tampered_library_is_refused(case, keys) -> None:
    root, _, cand = case
    sign(cand, keys[0])
    with open(cand, "ab") as f:
        f.write(b"\0")  # one byte appended after signing: still a loadable shared object
    err = refused(root, cand, keys[2])
    assert "libvgpu.so.sig by release@example.com does not match the file" in err


def test_a_signature_for_another_namespace_or_not_a_signature_is_refused(case, keys) -> None:
    root, _, cand = case
    subprocess.run(["ssh-keygen", "-Y", "sign", "-q", "-f", str(keys[0].private), "-n", "file", str(cand)],
                   check=True, capture_output=True)
    assert "was made for namespace 'file', not 'vgpu-patch'" in refused(root, cand, keys[2])
    cand.with_name("libvgpu.so.sig").write_text("garbage\n")
    assert "not an OpenSSH signature" in refused(root, cand, keys[2])


def test_a_signed_library_goes_live_and_a_rollback_needs_no_signature(case, keys, libs) -> None:
    root, d, cand = case
    sign(cand, keys[0])
    p = vgpu("deploy", "--no-check", "--local", str(root), "--allowed-signers", str(keys[2]), "--json", str(cand))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["signer"]["principal"] == "release@example.com" and doc["signer"]["key"].startswith("SHA256:")
    assert (d / "libvgpu.so").read_bytes() == cand.read_bytes()
    p = vgpu("deploy", "--no-check", "--local", str(root), "--dry-run", str(cand),
             env={**os.environ, "VGPU_PATCH_ALLOWED_SIGNERS": str(keys[2])})
    assert p.returncode == 0 and "signed by release@example.com (SHA256:" in p.stdout, p  # the env var works too
    # the vendor's file was never signed, and a rollback to it stays allowed
    p = vgpu("rollback", "--local", str(root), "--yes", "--to", "vendor")
    assert p.returncode == 0, p.stderr
    assert sha(d / "libvgpu.so") == sha(libs["vendor"])



def test_a_key_past_its_valid_before_is_refused_like_a_revoked_one(case, keys, tmp_path: Path) -> None:
    root, _, cand = case
    ours = keys[0]
    sign(cand, ours)  # a good signature by a key the file now time-boxes (docs/signing.md, key rotation)
    expired = tmp_path / "allowed_expired"
    expired.write_text(ours.allowed_line().replace('namespaces="vgpu-patch"',
                                                   'namespaces="vgpu-patch",valid-before="20200101"'))
    assert f"which {expired} does not allow" in refused(root, cand, expired)
    removed = tmp_path / "allowed_removed"  # revoked by deleting its line
    allowed_signers(removed, keys[1])
    assert f"which {removed} does not allow" in refused(root, cand, removed)
