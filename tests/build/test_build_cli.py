"""`vgpu-patch build` end to end: summary, --json, exit codes, the drop-in check hook."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu_patch.shim_build.headers import find_header_dirs, header_dir


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "build", *args], capture_output=True, text=True)


def test_json_is_one_document_and_logs_go_to_stderr(tmp_path: Path, fixture_src: Path) -> None:
    p = run_cli("--src", str(fixture_src), "-o", str(tmp_path / "out"), "--arch", "aarch64", "--no-check", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["build"]["arch"] == "aarch64" and doc["build"]["glibc_floor"] == "2.28"
    assert doc["library"] == str(tmp_path / "out" / "libvgpu.so")
    assert doc["check"] == {"skipped": "drop-in check skipped (--no-check)"}
    assert "building libvgpu.so" in p.stderr


def test_human_summary(tmp_path: Path, fixture_src: Path) -> None:
    p = run_cli("--src", str(fixture_src), "-o", str(tmp_path / "out"), "--glibc", "2.17", "--no-check")
    assert p.returncode == 0, p.stderr
    for word in ("libvgpu.so", "sha256", "x86_64" if "x86_64" in p.stdout else "aarch64", "2.17", "GLIBC_"):
        assert word in p.stdout
    assert "\x1b[" not in p.stdout + p.stderr  # no colours off a terminal


def test_check_runs_by_default_and_its_failure_is_the_exit_code(tmp_path: Path, fixture_src: Path) -> None:
    # the fixture exports 4 names, far from the vendor surface: the drop-in check must fail it
    p = run_cli("--src", str(fixture_src), "-o", str(tmp_path / "out"), "--json")
    doc = json.loads(p.stdout)
    if "skipped" in doc["check"]:
        assert p.returncode == 0 and "elf.check" in doc["check"]["skipped"]
        pytest.skip("vgpu_patch.elf.check not present yet")
    assert p.returncode == 4, p.stderr
    assert (tmp_path / "out" / "libvgpu.so").is_file()  # the build itself succeeded


def test_missing_compiler_exits_1_with_one_line(tmp_path: Path, fixture_src: Path) -> None:
    p = run_cli("--src", str(fixture_src), "-o", str(tmp_path / "out"), "--compiler", "/nonexistent")
    assert p.returncode == 1
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("vgpu-patch: error:")]
    assert len(err) == 1 and "vgpu-patch[build]" in err[0] and "Traceback" not in p.stderr


def test_bad_option_is_a_usage_error() -> None:
    assert run_cli("--glibc", "2.31").returncode == 2
    assert run_cli("--arch", "sparc").returncode == 2


def test_header_dir_has_both_headers() -> None:
    d = header_dir()
    assert (d / "cuda.h").is_file() and (d / "nvml.h").is_file()


def test_toolkit_with_both_headers_wins_and_one_without_nvml_is_skipped(tmp_path: Path) -> None:
    real = header_dir()
    partial = tmp_path / "toolkit-a" / "include"
    full = tmp_path / "toolkit-b" / "include"
    for d in (partial, full):
        d.mkdir(parents=True)
        (d / "cuda.h").write_bytes((real / "cuda.h").read_bytes())
    (full / "nvml.h").write_bytes((real / "nvml.h").read_bytes())
    assert find_header_dirs(toolkits=[partial, full]) == [full.resolve()]
    assert find_header_dirs(toolkits=[partial]) == [real]  # falls back to the wheels


def test_sign_writes_a_signature_and_a_rebuild_removes_a_stale_one(tmp_path: Path, fixture_src: Path) -> None:
    from signing_keys import allowed_signers, make_key

    from vgpu_patch.release import signing

    key = make_key(tmp_path / "keys", "release@example.com")
    out = tmp_path / "out"
    p = run_cli("--src", str(fixture_src), "-o", str(out), "--no-check", "--sign", str(key.private), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["signature"] == str(out / "libvgpu.so.sig")
    signer = signing.verify(out / "libvgpu.so", allowed_signers(tmp_path / "allowed", key))
    assert signer.principal == "release@example.com"
    p = run_cli("--src", str(fixture_src), "-o", str(out), "--no-check")  # the same bytes, but unsigned now
    assert p.returncode == 0 and not (out / "libvgpu.so.sig").exists(), p.stderr
    p = run_cli("--src", str(fixture_src), "-o", str(out), "--no-check", "--sign", str(tmp_path / "no-such-key"))
    assert p.returncode == 2 and "no-such-key" in p.stderr and "does not exist" in p.stderr


def test_sign_also_writes_a_signed_provenance_that_reproduce_takes(tmp_path: Path, fixture_src: Path) -> None:
    """`--sign` writes libvgpu.so.intoto.json (an in-toto statement of a SLSA v1 provenance naming the library's
    sha256, its source, toolchain and flags), signed with the same key; `--reproduce` takes it as the manifest;
    an unsigned rebuild removes both."""
    import hashlib

    from signing_keys import allowed_signers, make_key

    from vgpu_patch.release import provenance, signing

    key = make_key(tmp_path / "keys", "release@example.com")
    out = tmp_path / "out"
    p = run_cli("--src", str(fixture_src), "-o", str(out), "--no-check", "--sign", str(key.private), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    statement = out / "libvgpu.so.intoto.json"
    assert doc["provenance"] == str(statement) and doc["provenance_signature"] == str(statement) + ".sig"
    st = json.loads(statement.read_text())
    lib_sha = hashlib.sha256((out / "libvgpu.so").read_bytes()).hexdigest()
    assert st["_type"] == "https://in-toto.io/Statement/v1" and st["predicateType"] == "https://slsa.dev/provenance/v1"
    assert st["subject"] == [{"name": "libvgpu.so", "digest": {"sha256": lib_sha}}]
    build = st["predicate"]["buildDefinition"]
    manifest = json.loads((out / "libvgpu.so.json").read_text())
    assert build["resolvedDependencies"][0]["digest"]["sha256"] == manifest["source_sha256"]
    assert build["resolvedDependencies"][1]["annotations"]["version"] == manifest["compiler"]["version"]
    assert build["externalParameters"]["defines"] == manifest["defines"]
    assert build["internalParameters"]["flags"] == manifest["flags"]
    allowed = allowed_signers(tmp_path / "allowed", key)
    assert signing.verify(statement, allowed).principal == "release@example.com"  # the same key signed it
    prov = provenance.verified(out / "libvgpu.so", lib_sha, allowed, shown=out / "libvgpu.so")
    assert prov is not None and prov.source_sha256 == manifest["source_sha256"]
    p = run_cli("--reproduce", str(statement), "--src", str(fixture_src))
    assert p.returncode == 0 and p.stdout.startswith(f"reproduced: {statement} describes sha256 {lib_sha}"), p
    p = run_cli("--src", str(fixture_src), "-o", str(out), "--no-check")
    assert p.returncode == 0 and not statement.exists() and not (out / "libvgpu.so.intoto.json.sig").exists()
