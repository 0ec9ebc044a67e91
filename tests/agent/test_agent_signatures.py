"""`vgpu-patch agent --allowed-signers`: the image's library goes onto the host only with a valid signature
by an allowed key beside it; unsigned, foreign-signed or changed content is refused in one line with the
host untouched, and `--rollback` stays allowed. Real ssh-keygen keys, a temporary host root."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import Host, Image, sha
from signing_keys import Key, allowed_signers, make_key, sign


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Key, Key, Path]:
    d = tmp_path_factory.mktemp("keys")
    ours, theirs = make_key(d, "release@example.com"), make_key(d, "someone@elsewhere")
    return ours, theirs, allowed_signers(d / "allowed_signers", ours)


def agent(image: Image, host: Host, allowed: Path | None, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "vgpu_patch.cli", "agent", "--library", str(image.library), "--host-root",
            str(host.root), "--status-file", str(host.root.parent / "agent.json"), "--no-stale-scan", "--report", "off"]
    argv += ["--allowed-signers", str(allowed)] if allowed else []
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120)


def assert_refused(image: Image, host: Host, allowed: Path, words: str) -> None:
    before = host.live.read_bytes()
    p = agent(image, host, allowed, "--once")
    assert p.returncode == 1, p
    line = p.stderr.strip().splitlines()[-1]
    assert str(image.library) in line and words in line, p.stderr
    assert host.live.read_bytes() == before and not host.state.exists()  # no backup, no history, no lock


def test_unsigned_foreign_and_tampered_images_are_refused(image: Image, host: Host, keys) -> None:
    ours, theirs, allowed = keys
    assert_refused(image, host, allowed, "unsigned")
    sign(image.library, theirs)
    assert_refused(image, host, allowed, "does not allow")
    sign(image.library, ours)
    with open(image.library, "ab") as f:
        f.write(b"\0")
    (image.library.parent / "libvgpu.so.json").write_text(json.dumps({"sha256": sha(image.library)}))
    assert_refused(image, host, allowed, "does not match the file")


def test_a_signed_image_goes_live_and_rollback_needs_no_signature(image: Image, host: Host, vendor: Path,
                                                                  keys) -> None:
    sign(image.library, keys[0])
    p = agent(image, host, keys[2], "--once")
    assert p.returncode == 0, p.stderr
    assert "signed by release@example.com (SHA256:" in p.stderr
    assert sha(host.live) == image.sha256
    # the host keeps the .sig by the library's sha256; the status file names the live file's signer
    kept = host.state / "signatures" / f"{image.sha256}.sig"
    assert kept.read_bytes() == image.library.with_name("libvgpu.so.sig").read_bytes()
    signer = json.loads((host.root.parent / "agent.json").read_text())["live_signer"]
    assert signer["principal"] == "release@example.com" and signer["key"].startswith("SHA256:")
    p = agent(image, host, None, "--once", "--json")  # a later check without --allowed-signers reads it back
    assert p.returncode == 0 and json.loads(p.stdout)["live_signer"] == signer, p.stderr
    from vgpu_patch.agent.metrics import render
    from vgpu_patch.agent.status import AgentStatus

    metrics = render(AgentStatus("n", str(image.library), image.sha256, "/usr/local/vgpu", live_signer=signer))
    assert 'live_signer="release@example.com"' in metrics
    assert 'live_signer=""' in render(AgentStatus("n", str(image.library), image.sha256, "/usr/local/vgpu"))
    image.library.with_name("libvgpu.so.sig").unlink()  # the rollback does not look at the image's signature
    p = agent(image, host, keys[2], "--rollback")
    assert p.returncode == 0, p.stderr
    assert host.live.read_bytes() == vendor.read_bytes()


def test_the_images_signed_provenance_is_checked_and_shown(image: Image, host: Host, keys) -> None:
    """`build --sign` puts the build's provenance beside the library: the agent checks it with the library (from
    the same private copy), logs and reports what it states, and refuses a statement changed after signing."""
    from vgpu_patch.release import provenance

    ours, _, allowed = keys
    sign(image.library, ours)
    manifest = {"file": "libvgpu.so", "sha256": image.sha256, "source_sha256": "5" * 64, "hooks_def_sha256": "6" * 64,
                "compiler": {"kind": "gcc", "name": "gcc", "version": "gcc 12.2.0", "package": ""},
                "headers": {"sha256": "7" * 64, "cuda_version": 12080, "packages": {}}, "arch": "x86_64",
                "target": "x86_64-linux-gnu", "glibc_floor": None, "profile": "release", "defines": [],
                "flags": {"cflags": [], "ldflags": []}, "tool": "vgpu-patch 0.1.0"}
    statement = provenance.write(image.library, manifest, "0123456789ab")
    sign(statement, ours)
    good = statement.read_text()
    statement.write_text(good.replace("0123456789ab", "ba9876543210"))  # changed after signing
    assert_refused(image, host, allowed, "libvgpu.so.intoto.json.sig by release@example.com does not match the file")
    statement.write_text(good)
    p = agent(image, host, allowed, "--once")
    assert p.returncode == 0, p.stderr
    assert "from c_src 555555555555 (commit 0123456789ab) with gcc 12.2.0, as signed by release@example.com" in p.stderr
    status = json.loads((host.root.parent / "agent.json").read_text())
    assert status["provenance"]["commit"] == "0123456789ab" and status["provenance"]["signer"] == "release@example.com"
