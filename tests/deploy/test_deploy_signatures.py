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
from deploy_support import NO_SUDO, make_node, sha
from signing_keys import Key, allowed_signers, make_key, sign
from sshd_harness import known_hosts_file


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


def status(root: Path) -> dict:
    p = vgpu("status", "--local", str(root), "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["nodes"][0]["result"]


def test_the_node_keeps_the_signature_and_status_names_the_signer_until_a_rollback_to_the_vendor(
        case, keys, libs) -> None:
    root, d, cand = case
    sig = sign(cand, keys[0])
    vendor, v1 = sha(libs["vendor"]), sha(cand)
    assert status(root)["signer"] is None  # the vendor's file: unsigned
    p = vgpu("deploy", "--no-check", "--local", str(root), "--allowed-signers", str(keys[2]), str(cand))
    assert p.returncode == 0, p.stderr
    kept = d / ".vgpu-patch" / "signatures"
    assert (kept / f"{v1}.sig").read_bytes() == sig.read_bytes()  # the .sig itself, by the library's sha256
    record = json.loads((kept / f"{v1}.json").read_text())
    assert record["sha256"] == v1 and record["signer"]["principal"] == "release@example.com"
    st = status(root)
    assert st["signer"] == record["signer"] and st["signer"]["key"].startswith("SHA256:")
    assert st["history"][-1]["signer"] == record["signer"]  # the history's deploy record names it too
    p = vgpu("status", "--local", str(root))
    assert p.returncode == 0 and "release@example.com" in p.stdout, p
    # anyone can check the kept signature by hand against the live file, as docs/signing.md shows
    with open(d / "libvgpu.so", "rb") as f:
        subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(keys[2]), "-I", "release@example.com", "-n",
                        "vgpu-patch", "-s", str(kept / f"{v1}.sig")], stdin=f, check=True, capture_output=True)
    # an unsigned deploy (no --allowed-signers) leaves an unsigned live file and no signer in its record
    p = vgpu("deploy", "--no-check", "--local", str(root), str(libs["v2"]))
    assert p.returncode == 0, p.stderr
    st = status(root)
    assert st["signer"] is None and "signer" not in st["history"][-1]
    assert "unsigned" in vgpu("status", "--local", str(root)).stdout
    # a rollback to the signed backup shows its signer again; one to the vendor's file shows unsigned
    assert vgpu("rollback", "--local", str(root), "--yes").returncode == 0
    assert status(root)["sha256"] == v1 and status(root)["signer"] == record["signer"]
    assert vgpu("rollback", "--local", str(root), "--yes", "--to", "vendor").returncode == 0
    st = status(root)
    assert st["sha256"] == vendor and st["signer"] is None
    assert sorted(p.name for p in kept.iterdir()) == [f"{v1}.json", f"{v1}.sig"]  # kept for a later rollback


def test_a_signed_deploy_over_ssh_keeps_the_signature_in_the_same_session(sshd_root, keys, libs,
                                                                           tmp_path: Path) -> None:
    d = make_node(tmp_path / "n", libs["vendor"], target="vgpu")
    for p in (tmp_path, tmp_path / "n", d):
        p.chmod(0o755)
    cand = tmp_path / "libvgpu.so"
    shutil.copyfile(libs["v1"], cand)
    sign(cand, keys[0])
    kh = known_hosts_file([sshd_root], tmp_path / "known_hosts")
    ssh = ["--host", sshd_root.target, "-i", str(sshd_root.key_path), "--known-hosts", str(kh), *NO_SUDO,
           "--target-dir", str(d)]
    p = vgpu("deploy", "--no-check", *ssh, "--allowed-signers", str(keys[2]), str(cand))
    assert p.returncode == 0, p.stderr
    p = vgpu("status", *ssh, "--json")
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)["nodes"][0]["result"]
    assert st["sha256"] == sha(cand) and st["signer"]["principal"] == "release@example.com"


def test_a_signature_the_node_cannot_keep_refuses_the_swap_before_the_rename(case, keys, libs) -> None:
    root, d, cand = case
    sign(cand, keys[0])
    (d / ".vgpu-patch").mkdir()
    (d / ".vgpu-patch" / "signatures").write_text("in the way\n")  # not a directory: nothing can be kept in it
    p = vgpu("deploy", "--no-check", "--local", str(root), "--allowed-signers", str(keys[2]), str(cand))
    out = " ".join(p.stdout.split())  # the fleet table names the node's one-line reason
    assert p.returncode == 1 and "cannot create" in out and "signatures" in out, p
    assert sha(d / "libvgpu.so") == sha(libs["vendor"])  # the old file stays live, nothing recorded
    assert not (d / ".vgpu-patch" / "history.jsonl").exists()


def _manifest(lib: Path) -> dict:
    """What `vgpu-patch build` records, for a library the test built itself."""
    return {"file": "libvgpu.so", "sha256": sha(lib), "source_sha256": "5" * 64, "hooks_def_sha256": "6" * 64,
            "compiler": {"kind": "gcc", "name": "gcc", "version": "gcc (Debian 12.2.0-14) 12.2.0", "package": ""},
            "headers": {"sha256": "7" * 64, "cuda_version": 12080, "packages": {}}, "arch": "x86_64",
            "target": "x86_64-linux-gnu", "glibc_floor": None, "profile": "release", "defines": [],
            "flags": {"cflags": [], "ldflags": []}, "tool": "vgpu-patch 0.1.0"}


def test_the_builds_provenance_is_checked_and_shown(case, keys, libs) -> None:
    """The build's signed provenance beside the library (`build --sign`): deploy names what it states about the
    file it verified, and refuses a statement that was changed, names other bytes, or no allowed key signed."""
    from vgpu_patch.release import provenance

    root, d, cand = case
    ours, theirs, allowed = keys
    sign(cand, ours)
    statement = provenance.write(cand, _manifest(cand), "0123456789ab")
    sign(statement, ours)
    p = vgpu("deploy", "--no-check", "--local", str(root), "--allowed-signers", str(allowed), "--json", "--dry-run",
             str(cand))
    assert p.returncode == 1 and p.stderr.count("error") == 0, p.stderr  # dry-run: pending
    assert json.loads(p.stdout)["provenance"] == {
        "signer": "release@example.com", "source_sha256": "5" * 64, "commit": "0123456789ab",
        "compiler": "gcc (Debian 12.2.0-14) 12.2.0", "builder": "urn:vgpu-patch:builder:vgpu-patch:0.1.0"}
    p = vgpu("deploy", "--no-check", "--local", str(root), "--allowed-signers", str(allowed), str(cand))
    assert p.returncode == 0, p.stderr
    assert "from c_src 555555555555 (commit 0123456789ab)" in " ".join(p.stdout.split()), p.stdout
    shutil.copyfile(libs["vendor"], d / "libvgpu.so")

    statement.write_text(statement.read_text().replace("0123456789ab", "ba9876543210"))  # changed after signing
    assert "libvgpu.so.intoto.json.sig by release@example.com does not match the file" in refused(root, cand, allowed)
    provenance.write(cand, {**_manifest(cand), "sha256": "8" * 64})  # another build's statement, signed
    sign(statement, ours)
    assert "states the build of sha256 888888888888, not of this file" in refused(root, cand, allowed)
    provenance.write(cand, _manifest(cand))
    sign(statement, theirs)
    assert "which" in refused(root, cand, allowed) and "does not allow" in refused(root, cand, allowed)
    statement.with_name("libvgpu.so.intoto.json.sig").unlink()
    assert "libvgpu.so.intoto.json: unsigned" in refused(root, cand, allowed)
