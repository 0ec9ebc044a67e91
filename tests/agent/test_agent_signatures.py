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
