"""The candidate is read once: `deploy --allowed-signers` takes its sha256, ELF facts, signature check and upload
from one private snapshot, so a writer of the candidate's directory who renames another file into place between
reads never gets bytes live other than the ones verified. Every read position is tried, both ways round (the
signed build visible at that read only, and at every read but that one). Real ssh-keygen keys, a --local node."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import make_node, sha
from read_swapper import ReadSwapper, patterns
from signing_keys import allowed_signers, make_key, sign

from vgpu_patch.cli import main


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    d = tmp_path_factory.mktemp("keys")
    key = make_key(d, "release@example.com")
    return allowed_signers(d / "allowed_signers", key), key


def deploy_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(argv)
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


def test_the_live_bytes_are_the_verified_bytes_whatever_read_the_candidate_is_swapped_at(
        tmp_path: Path, libs: dict[str, Path], allowed, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    allowed_file, key = allowed
    out = tmp_path / "out"
    out.mkdir()
    cand = out / "libvgpu.so"
    shutil.copyfile(libs["v1"], cand)
    sign(cand, key)  # libvgpu.so.sig: a good signature of the signed build, left in place throughout
    files = {"signed": libs["v1"].read_bytes(), "unsigned": libs["v2"].read_bytes()}
    swapper = ReadSwapper(cand, files).install(monkeypatch)

    def run(name: str) -> tuple[int, str, str, Path]:
        root = tmp_path / name.replace(" ", "-")
        d = make_node(root, libs["vendor"])
        code, stdout, stderr = deploy_in_process(
            ["deploy", "--no-check", "--local", str(root), "--allowed-signers", str(allowed_file), "--json",
             str(cand)], capsys)
        return code, stdout, stderr, d

    swapper.put("signed")
    code, stdout, stderr, _ = run("counting")
    assert code == 0, stderr
    reads = swapper.reads
    assert reads >= 1
    for name, plan in patterns(reads, "signed", "unsigned"):
        swapper.reads, swapper.shown, swapper.plan = 0, [], plan
        swapper.put("unsigned" if plan(0) == "signed" else "signed")  # whatever was there before the first read
        code, stdout, stderr, d = run(name)
        live = (d / "libvgpu.so").read_bytes()
        if code != 0:
            why = stderr.strip() or stdout  # refused here (one line), or by the node (its row of the --json document)
            assert live == libs["vendor"].read_bytes(), f"{name}: refused ({why}) but the node changed"
            continue
        assert live == files["signed"], f"{name}: bytes other than the verified ones went live ({swapper.shown})"
        doc = json.loads(stdout)
        assert doc["sha256"] == sha(d / "libvgpu.so") and doc["signer"]["principal"] == "release@example.com"
        kept = d / ".vgpu-patch" / "signatures" / f"{sha(d / 'libvgpu.so')}.sig"
        with open(d / "libvgpu.so", "rb") as f:  # the kept signature is of the live bytes
            subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed_file), "-I", "release@example.com", "-n",
                            "vgpu-patch", "-s", str(kept)], stdin=f, check=True, capture_output=True)
    assert reads == 1, f"the candidate was opened {reads} times; read it once, into a private snapshot"


def test_the_snapshot_is_private_and_gone_when_the_command_ends(tmp_path: Path, libs: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import gc
    import stat
    import tempfile

    from vgpu_patch.deploy.candidate import inspect

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    src = tmp_path / "libvgpu.so"
    shutil.copyfile(libs["v1"], src)
    src.with_name("libvgpu.so.sig").write_text("not checked here\n")
    cand = inspect(src)
    assert cand.source == src and cand.path != src and cand.path.name == src.name and cand.sha256 == sha(src)
    assert stat.S_IMODE(cand.path.parent.stat().st_mode) == 0o700  # a directory only we can write
    assert stat.S_IMODE(cand.path.stat().st_mode) == 0o400
    assert cand.path.with_name("libvgpu.so.sig").read_text() == "not checked here\n"  # read with it, once
    del cand
    gc.collect()
    assert list(scratch.iterdir()) == []
    # the CLI's process removes it at exit too (it leaves through os._exit after the exit handlers)
    root = tmp_path / "node"
    make_node(root, libs["vendor"])
    argv = [sys.executable, "-m", "vgpu_patch.cli", "deploy", "--no-check", "--local", str(root), str(src)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)})
    assert p.returncode == 0, p.stderr
    assert list(scratch.iterdir()) == []


def test_a_candidate_that_changes_size_while_read_is_refused_naming_it(tmp_path: Path, libs: dict[str, Path],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "node"
    d = make_node(root, libs["vendor"])
    fifo = tmp_path / "pipe.so"
    os.mkfifo(fifo)
    code, _, err = deploy_in_process(["deploy", "--no-check", "--local", str(root), str(fifo)], capsys)
    assert code == 1 and f"candidate {fifo} is not a regular file" in err, err  # and did not block on the FIFO
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()


def test_an_oversized_signature_is_read_bounded_and_refused(tmp_path: Path, libs: dict[str, Path], allowed,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "node"
    make_node(root, libs["vendor"])
    cand = tmp_path / "libvgpu.so"
    shutil.copyfile(libs["v1"], cand)
    big = "-----BEGIN SSH SIGNATURE-----\n" + ("A" * 76 + "\n") * 2000 + "-----END SSH SIGNATURE-----\n"
    cand.with_name("libvgpu.so.sig").write_text(big)  # 150 KiB: no signature is that long
    code, _, err = deploy_in_process(["deploy", "--no-check", "--local", str(root), "--allowed-signers",
                                      str(allowed[0]), str(cand)], capsys)
    assert code == 1 and f"{cand.with_name('libvgpu.so.sig')}: not an OpenSSH signature" in err, err
