"""Real builds of the fixture tree for both glibc floors and both arches, proven from the ELF."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest
from buildtree import EXPORTS, needs_gcc
from elftools.elf.elffile import ELFFile

from vgpu_patch.elf import proof
from vgpu_patch.shim_build.toolchain import host_arch

TARGETS = [("x86_64", "2.28"), ("x86_64", "2.17"), ("aarch64", "2.28"), ("aarch64", "2.17")]
MACHINE = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}


def vt(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.parametrize("arch,glibc", TARGETS)
def test_floor_and_arch_hold_in_the_elf(built, arch: str, glibc: str) -> None:
    r = built(arch, glibc)
    with open(r.library, "rb") as f:
        elf = ELFFile(f)
        assert elf["e_machine"] == MACHINE[arch]
        needed = []
        for _vn, auxes in elf.get_section_by_name(".gnu.version_r").iter_versions():
            needed += [a.name for a in auxes]
    glibc_needed = [n for n in needed if n.startswith("GLIBC_")]
    assert glibc_needed, "dlsym/pthread_create must be versioned imports"
    assert "GLIBC_PRIVATE" not in glibc_needed
    assert max(vt(n[len("GLIBC_"):]) for n in glibc_needed) <= vt(glibc)
    m = r.manifest
    assert (m["arch"], m["glibc_floor"], m["compiler"]["kind"]) == (arch, glibc, "zig")
    assert m["target"] == f"{arch}-linux-gnu.{glibc}"
    assert vt(m["glibc_max_required"]) <= vt(glibc)
    assert m["glibc_versions"] == sorted(set(glibc_needed), key=lambda n: vt(n[6:]))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils readelf not installed")
@pytest.mark.parametrize("arch,glibc", TARGETS)
def test_readelf_agrees(built, arch: str, glibc: str) -> None:
    lib = built(arch, glibc).library
    info = subprocess.run(["readelf", "--version-info", "-W", str(lib)], capture_output=True, text=True, check=True)
    versions = set(re.findall(r"Name: (GLIBC_[\w.]+)", info.stdout))
    assert versions and all(vt(v[6:]) <= vt(glibc) for v in versions), versions
    hdr = subprocess.run(["readelf", "-h", str(lib)], capture_output=True, text=True, check=True).stdout
    assert {"x86_64": "X86-64", "aarch64": "AArch64"}[arch] in hdr


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_exports_equal_the_version_script(built, arch: str) -> None:
    r = built(arch, "2.28")
    facts = proof.read_facts(r.library)
    assert facts.exports == sorted(EXPORTS)  # hidden helpers and data stay local
    assert "fx_internal_counter" not in facts.exports and "fx_core_init" not in facts.exports
    assert facts.soname == "libvgpu.so"
    assert not facts.exec_stack
    assert facts.build_id and r.manifest["build_id"] == facts.build_id
    assert r.manifest["exports"] == len(EXPORTS)


def test_tests_dir_and_non_sources_are_not_compiled(built) -> None:
    assert built().manifest["sources"] == ["core.c", "interpose/hooks.c", "interpose/trampoline.S"]


@needs_gcc
@pytest.mark.skipif(host_arch() != "x86_64", reason="host gcc targets x86_64 here")
def test_host_gcc_build_without_floor(built) -> None:
    r = built("x86_64", None, "gcc")
    assert r.manifest["compiler"]["kind"] == "gcc"
    assert r.manifest["glibc_floor"] is None
    assert proof.read_facts(r.library).exports == sorted(EXPORTS)


@needs_gcc
def test_debug_profile_has_debug_info_and_no_absolute_source_paths(built, fixture_src) -> None:
    r = built(None, None, "gcc", "debug")  # gcc: zig's first debug build compiles a debug libc (slow)
    assert "VGPU_DEBUG_BUILD=1" in r.manifest["defines"]
    assert "-O0" in r.manifest["flags"]["cflags"] and "-g" in r.manifest["flags"]["cflags"]
    data = r.library.read_bytes()
    with open(r.library, "rb") as f:
        assert ELFFile(f).get_section_by_name(".debug_info") is not None
    assert str(fixture_src).encode() not in data and b"vgpu-build-" not in data
    assert b"vgpu: debug init at %s" in data  # VGPU_DEBUG_BUILD reached the C
    assert b"\0core.c\0" in data  # __FILE__ is relative after -ffile-prefix-map


@pytest.mark.skipif(host_arch() != "x86_64", reason="loads an x86_64 build into this process")
@pytest.mark.parametrize("glibc", ["2.28", "2.17"])
def test_floor_build_loads_and_runs_on_this_host(built, glibc: str) -> None:
    lib = ctypes.CDLL(str(built("x86_64", glibc).library))
    free_b, total_b = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.cuMemGetInfo_v2(ctypes.byref(free_b), ctypes.byref(total_b)) == 0
    assert total_b.value == 4 << 30
    assert lib.vgpuFixtureTrampoline() == 0
    with pytest.raises(AttributeError):
        lib.fx_core_init  # noqa: B018 - the lookup itself must fail: the helper is hidden


def test_glibc_release_names() -> None:
    assert proof.glibc_release("GLIBC_2.2.5") == "2.2.5"
    assert proof.glibc_release("GLIBC_ABI_DT_RELR") == "2.36"
    assert proof.glibc_release("GLIBC_PRIVATE") is None
