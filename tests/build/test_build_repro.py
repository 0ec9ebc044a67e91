"""Same inputs, same bytes: two builds from copies of the tree at different paths match; the manifest
describes the build without timestamps or absolute paths."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from buildtree import FILES, needs_gcc, write_tree

import vgpu_patch
from vgpu_patch import __version__
from vgpu_patch.report.errors import BuildError, UsageError
from vgpu_patch.shim_build.build import build_shim
from vgpu_patch.shim_build.manifest import source_hash
from vgpu_patch.shim_build.reproduce import reproduce

MANIFEST_KEYS = {
    "schema", "file", "soname", "sha256", "size", "build_id", "arch", "target", "glibc_floor",
    "glibc_max_required", "glibc_versions", "needed", "compiler", "profile", "defines", "flags",
    "sources", "source_sha256", "hooks_def_sha256", "exports", "headers", "tool",
}


def two_builds(tmp_path: Path, **kw) -> tuple:
    """Build two copies of the fixture tree, at different paths, into different out dirs."""
    a = build_shim(tmp_path / "out-a", src_dir=write_tree(tmp_path / "a" / "c_src"), **kw)
    b = build_shim(tmp_path / "deeper" / "out-b", src_dir=write_tree(tmp_path / "b" / "x" / "c_src"), **kw)
    return a, b


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_zig_builds_are_reproducible(tmp_path: Path, arch: str) -> None:
    a, b = two_builds(tmp_path, arch=arch, glibc="2.28")
    assert a.library.read_bytes() == b.library.read_bytes()
    assert a.manifest == b.manifest
    assert a.manifest_path.read_bytes() == b.manifest_path.read_bytes()


def test_zig_build_does_not_depend_on_the_cache_state(tmp_path: Path, built, monkeypatch) -> None:
    monkeypatch.setenv("VGPU_PATCH_ZIG_CACHE", str(tmp_path / "fresh-zig-cache"))
    r = build_shim(tmp_path / "out", arch="x86_64", glibc="2.28", src_dir=write_tree(tmp_path / "elsewhere"))
    assert r.sha256 == built("x86_64", "2.28").sha256
    assert not list((tmp_path / "out").glob(".*"))  # no temp files left next to the library


@needs_gcc
@pytest.mark.parametrize("profile", ["release", "debug"])
def test_gcc_builds_are_reproducible(tmp_path: Path, profile: str) -> None:
    a, b = two_builds(tmp_path, arch=None, glibc=None, compiler="gcc", profile=profile)
    assert a.sha256 == b.sha256 == hashlib.sha256(b.library.read_bytes()).hexdigest()


def test_manifest_fields(built, fixture_src: Path) -> None:
    r = built("x86_64", "2.28")
    m = r.manifest
    assert set(m) == MANIFEST_KEYS
    assert json.loads(r.manifest_path.read_text()) == m
    assert r.manifest_path == r.library.with_name("libvgpu.so.json")
    assert m["sha256"] == hashlib.sha256(r.library.read_bytes()).hexdigest()
    assert m["size"] == r.library.stat().st_size
    assert m["compiler"]["name"] == "zig cc" and m["compiler"]["version"].startswith("zig 0.")
    assert m["profile"] == "release" and "-O2" in m["flags"]["cflags"] and "-g0" in m["flags"]["cflags"]
    assert "-Wl,--build-id=sha1" in m["flags"]["ldflags"] and "-Wl,-soname,libvgpu.so" in m["flags"]["ldflags"]
    assert m["tool"] == f"vgpu-patch {__version__}"
    assert m["source_sha256"] == source_hash(fixture_src)
    assert m["hooks_def_sha256"] == hashlib.sha256((fixture_src / "driver/hooks.def").read_bytes()).hexdigest()
    assert m["headers"]["cuda_version"] >= 12000
    assert f'VGPU_VERSION="{__version__}"' in m["defines"]
    text = r.manifest_path.read_text()
    assert str(fixture_src) not in text and "/tmp" not in text and "site-packages" not in text
    assert "built_at" not in m  # no timestamps: the manifest is as reproducible as the .so


def test_source_hash_follows_sources_not_tests(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "c_src")
    h0 = source_hash(src)
    (src / "tests" / "broken.c").write_text("changed test file\n")
    (src / "notes.txt").write_text("not a source\n")
    assert source_hash(src) == h0
    (src / "core.h").write_text(FILES["core.h"] + "/* edit */\n")
    assert source_hash(src) != h0
    (src / "core.h").write_text(FILES["core.h"])
    (src / "driver" / "hooks.def").rename(src / "driver" / "hooks2.def")
    assert source_hash(src) != h0  # paths count, not only contents


def test_source_change_changes_the_library(tmp_path: Path, built) -> None:
    base = built("x86_64", "2.28")
    files = dict(FILES)
    files["core.c"] = FILES["core.c"].replace("(size_t)4 << 30", "(size_t)8 << 30")
    r = build_shim(tmp_path / "out", arch="x86_64", glibc="2.28", src_dir=write_tree(tmp_path / "c_src", files))
    assert r.sha256 != base.sha256 and r.manifest["source_sha256"] != base.manifest["source_sha256"]


def test_manifest_records_the_compiler_and_header_wheels(built) -> None:
    m = built("x86_64", "2.28").manifest
    assert m["compiler"]["package"] == f"ziglang {importlib.metadata.version('ziglang')}"
    packages = m["headers"]["packages"]  # empty only when the headers come from a CUDA toolkit
    for name, version in packages.items():
        assert importlib.metadata.version(name) == version
    assert packages or m["headers"]["sha256"]


def test_a_date_macro_fails_the_build(tmp_path: Path, make_src) -> None:
    src = make_src(**{"core.c": FILES["core.c"] + 'const char *fx_when = __DATE__;\n'})
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", arch="x86_64", glibc="2.28", src_dir=src)
    assert "date-time" in str(e.value) and "\n" not in str(e.value)


def test_source_date_epoch_is_honoured_and_checked(tmp_path: Path, fixture_src: Path, built, monkeypatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    r = build_shim(tmp_path / "out", arch="x86_64", glibc="2.28", src_dir=fixture_src)
    assert r.sha256 == built("x86_64", "2.28").sha256  # -Wdate-time keeps the epoch out of the bytes
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(UsageError, match="SOURCE_DATE_EPOCH='yesterday'"):
        build_shim(tmp_path / "out2", arch="x86_64", glibc="2.28", src_dir=fixture_src)


def run_build(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "build", *args], capture_output=True, text=True,
                          timeout=900)


def test_reproduce_rebuilds_and_matches(built, fixture_src: Path) -> None:
    r = built("aarch64", "2.28")
    p = run_build("--reproduce", str(r.manifest_path), "--src", str(fixture_src))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (f"reproduced: {r.manifest_path} describes sha256 {r.sha256}, and the rebuild "
                                "has it")
    assert reproduce(r.manifest_path, fixture_src).ok


def test_reproduce_names_the_inputs_that_differ(built, make_src) -> None:
    r = built("x86_64", "2.28")
    changed = make_src(**{"core.c": FILES["core.c"].replace("(size_t)4 << 30", "(size_t)2 << 30")})
    p = run_build("--reproduce", str(r.manifest_path), "--src", str(changed))
    assert p.returncode == 1
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{r.manifest_path}: the rebuild has sha256 ") and r.sha256 in line
    assert "inputs that differ here: source_sha256" in line
    doc = json.loads(run_build("--reproduce", str(r.manifest_path), "--src", str(changed), "--json").stdout)
    assert doc["ok"] is False and doc["recorded_sha256"] == r.sha256 and "source_sha256" in doc["differing_inputs"]


def test_reproduce_takes_the_settings_from_the_manifest(built) -> None:
    p = run_build("--reproduce", str(built("x86_64", "2.28").manifest_path), "--arch", "aarch64", "-o", "x")
    assert p.returncode == 2 and "drop --output, --arch" in p.stderr


def _manifest_copy(src: Path, dest: Path, **changes) -> Path:
    doc = json.loads(src.read_text())
    doc.update(changes)
    dest.write_text(json.dumps(doc))
    return dest


@needs_gcc
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_reproduce_never_runs_the_compiler_the_manifest_names(built, fixture_src: Path, tmp_path: Path,
                                                              where: str) -> None:
    """A manifest someone sent names `./cc` (or an absolute path) beside a script: the script never runs; the
    rebuild uses this install's gcc and the verdict says so."""
    r = built(None, None, "gcc")
    work = tmp_path / "sent"
    work.mkdir()
    marker = tmp_path / "ran"
    cc = work / "cc"
    cc.write_text(f"#!/bin/sh\necho ran >> {marker}\nexec gcc \"$@\"\n")
    cc.chmod(0o755)
    name = "./cc" if where == "relative" else str(cc)
    compiler = {**r.manifest["compiler"], "name": name}
    manifest = _manifest_copy(r.manifest_path, work / "libvgpu.so.json", compiler=compiler)
    p = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "build", "--reproduce", str(manifest), "--src",
                        str(fixture_src)], capture_output=True, text=True, timeout=900, cwd=work,
                       env={**os.environ, "PATH": f"{work}:{os.environ['PATH']}",  # ./cc first on PATH, even
                            "PYTHONPATH": str(Path(vgpu_patch.__file__).parents[1])})  # this checkout, from `work`
    assert not marker.exists(), "the compiler the manifest names was run"
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip()
    assert line.startswith(f"reproduced: {manifest} describes sha256 {r.sha256}"), line
    assert f"rebuilt with this install's gcc, not the manifest's {name}" in line


@needs_gcc
def test_reproduce_names_every_define_a_release_build_lacks_and_refuses_unknown_ones(built, fixture_src: Path,
                                                                                     tmp_path: Path) -> None:
    r = built(None, None, "gcc")
    defines = r.manifest["defines"]
    known = _manifest_copy(r.manifest_path, tmp_path / "known.json", defines=[*defines, "VGPU_DEBUG_BUILD=1"])
    rep = reproduce(known, fixture_src)
    assert "not a release build: it defines VGPU_DEBUG_BUILD=1" in rep.line()
    assert rep.to_json()["defines_not_in_release"] == ["VGPU_DEBUG_BUILD=1"]

    unknown = _manifest_copy(r.manifest_path, tmp_path / "unknown.json", defines=[*defines, "VGPU_SKIP_LIMITS=1"])
    p = run_build("--reproduce", str(unknown), "--src", str(fixture_src))
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 2, p.stderr  # the "rebuilding" line + one
    err = p.stderr.strip().splitlines()[-1]
    assert "defines VGPU_SKIP_LIMITS=1, unknown to this version's shim build" in err and "--allow-defines" in err
    p = run_build("--reproduce", str(unknown), "--src", str(fixture_src), "--allow-defines", "--json")
    doc = json.loads(p.stdout)
    assert doc["defines_not_in_release"] == ["VGPU_SKIP_LIMITS=1"], doc  # applied, and named
    assert p.returncode in (0, 1)
    line = run_build("--reproduce", str(unknown), "--src", str(fixture_src), "--allow-defines").stdout
    line += run_build("--reproduce", str(unknown), "--src", str(fixture_src), "--allow-defines").stderr
    assert "not a release build: it defines VGPU_SKIP_LIMITS=1" in line
    assert run_build("--allow-defines", "-o", str(tmp_path / "o")).returncode == 2  # only with --reproduce


@needs_gcc
def test_reproduce_of_a_debug_build_names_its_define(built, fixture_src: Path) -> None:
    r = built(None, None, "gcc", "debug")
    rep = reproduce(r.manifest_path, fixture_src)
    assert rep.ok and "not a release build: it defines VGPU_DEBUG_BUILD=1" in rep.line()


def test_reproduce_refuses_a_malformed_define_or_compiler_kind(built, tmp_path: Path) -> None:
    r = built("x86_64", "2.28")
    bad = _manifest_copy(r.manifest_path, tmp_path / "bad.json", defines=["X=1\n#include </etc/shadow>"])
    with pytest.raises(UsageError, match="malformed defines"):
        reproduce(bad)
    odd = _manifest_copy(r.manifest_path, tmp_path / "odd.json", compiler={"kind": "tcc", "name": "./tcc"})
    with pytest.raises(UsageError, match="compiler kind 'tcc' is unknown"):
        reproduce(odd)
