"""Every named failure gives a one-line error that says what failed, where, and what to do."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from buildtree import FILES, have_gcc, needs_gcc

from vgpu_patch.report.errors import BuildError, UsageError
from vgpu_patch.shim_build.build import build_shim
from vgpu_patch.shim_build.headers import find_header_dirs
from vgpu_patch.shim_build.toolchain import host_arch, host_glibc, version_tuple


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_compiler_names_what_was_tried_and_how_to_install(tmp_path: Path, fixture_src: Path) -> None:
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", compiler="/nonexistent/cc", src_dir=fixture_src)
    msg = one_line(e)
    assert "/nonexistent/cc" in msg and "vgpu-patch[build]" in msg and "apt-get install gcc" in msg
    assert not (tmp_path / "out").exists()  # nothing half-made


@pytest.mark.parametrize("kw,word", [({"arch": "riscv64"}, "arch"), ({"glibc": "2.31"}, "glibc floor"),
                                     ({"profile": "fast"}, "profile")])
def test_unknown_target_or_profile_is_a_usage_error(tmp_path: Path, fixture_src: Path, kw: dict, word: str) -> None:
    with pytest.raises(UsageError) as e:
        build_shim(tmp_path / "out", src_dir=fixture_src, **kw)
    assert word in one_line(e) and "choose" in str(e.value)


@pytest.mark.parametrize("compiler", [None, "gcc"])
def test_compiler_error_shows_first_error_and_a_rerunnable_command(make_src, tmp_path: Path, compiler) -> None:
    if compiler == "gcc" and not have_gcc():
        pytest.skip("gcc not installed")
    bad = FILES["core.c"].replace("size_t fx_limit(void) {", "size_t fx_limit(void) { int unused_var;")
    src = make_src(**{"core.c": bad})
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", glibc=None if compiler else "2.28", compiler=compiler, src_dir=src)
    msg = one_line(e)
    assert msg.startswith("compiling core.c failed: ")
    assert "unused_var" in msg and "error" in msg  # -Werror turned the warning into the first error
    cmd = Path(msg.rsplit("(command: ", 1)[1].rstrip(")"))
    assert cmd.is_file()
    rerun = subprocess.run(["sh", str(cmd)], capture_output=True, text=True)
    assert rerun.returncode != 0 and "unused_var" in rerun.stderr
    assert (cmd.parent / cmd.name.replace(".sh", ".log")).is_file()
    shutil.rmtree(cmd.parent)  # the kept build dir is the user's to delete


def test_missing_hooks_def(tmp_path: Path, make_src) -> None:
    src = make_src()
    (src / "driver" / "hooks.def").unlink()
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", src_dir=src)
    assert "hooks.def" in one_line(e)


@needs_gcc
def test_hook_without_definition_fails_the_proof(tmp_path: Path, make_src) -> None:
    # GNU ld ignores version-script names that are not defined; the ELF proof does not
    src = make_src(**{"driver/hooks.def": FILES["driver/hooks.def"] + "HOOK(cuMissing, CUDA, OWN)\n"})
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", glibc=None, compiler="gcc", src_dir=src)
    assert "missing: cuMissing" in one_line(e) and "hooks.def" in str(e.value)


def test_hook_without_definition_fails_with_zig(tmp_path: Path, make_src) -> None:
    src = make_src(**{"driver/hooks.def": FILES["driver/hooks.def"] + "HOOK(cuMissing, CUDA, OWN)\n"})
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", arch="x86_64", glibc="2.28", compiler="zig", src_dir=src)
    assert "cuMissing" in one_line(e)  # lld refuses the version script before the proof runs
    if "(command: " in str(e.value):
        shutil.rmtree(Path(str(e.value).rsplit("(command: ", 1)[1].rstrip(")")).parent)


@needs_gcc
@pytest.mark.skipif(host_arch() != "x86_64" or version_tuple(host_glibc() or "0") <= (2, 28),
                    reason="needs an x86_64 host whose glibc is newer than 2.28")
def test_host_gcc_cannot_meet_an_older_floor_and_the_proof_says_so(tmp_path: Path, fixture_src: Path) -> None:
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", glibc="2.28", compiler="gcc", src_dir=fixture_src)
    msg = one_line(e)
    assert "GLIBC_2.3" in msg and "floor is glibc 2.28" in msg and "--compiler zig" in msg
    assert not (tmp_path / "out" / "libvgpu.so").exists()


@needs_gcc
def test_glibc_private_import_is_refused(tmp_path: Path, make_src) -> None:
    hooks = FILES["interpose/hooks.c"] + (
        "extern void _nss_files_setprotoent(void);\n"
        "VGPU_EXPORT void vgpuPriv(void) { _nss_files_setprotoent(); }\n"
    )
    src = make_src(**{"interpose/hooks.c": hooks,
                      "driver/hooks.def": FILES["driver/hooks.def"] + "HOOK(vgpuPriv, LIBC, OWN)\n"})
    try:
        build_shim(tmp_path / "out", glibc=None, compiler="gcc", src_dir=src)
    except BuildError as e:
        assert "GLIBC_PRIVATE" in str(e) and "\n" not in str(e)
    else:
        pytest.skip("this host's libc does not export _nss_files_setprotoent@GLIBC_PRIVATE")


@pytest.mark.skipif(host_arch() != "x86_64", reason="x86_64 host gcc")
@needs_gcc
def test_gcc_for_another_arch_is_refused_before_compiling(tmp_path: Path, fixture_src: Path) -> None:
    with pytest.raises(BuildError) as e:
        build_shim(tmp_path / "out", arch="aarch64", compiler="gcc", src_dir=fixture_src)
    assert "not aarch64" in one_line(e) and "--compiler zig" in str(e.value)


def test_no_headers_names_both_options() -> None:
    with pytest.raises(BuildError) as e:
        find_header_dirs(toolkits=[Path("/nonexistent/cuda/include")], wheels=[])
    msg = one_line(e)
    assert "CUDA_HOME" in msg and "vgpu-patch[build]" in msg


def test_hooks_def_in_the_old_place_still_builds(make_src, tmp_path: Path) -> None:
    """A tree from before the driver/ layer (hooks.def in interpose/) builds as c_src/driver/hooks.def does."""
    from vgpu_patch.shim_build.sources import find_hooks_def

    src = make_src()
    (src / "driver" / "hooks.def").rename(src / "interpose" / "hooks.def")
    assert find_hooks_def(src) == src / "interpose" / "hooks.def"
    r = build_shim(tmp_path / "out", src_dir=src, arch="x86_64", glibc="2.28")
    assert r.manifest["hooks_def_sha256"] == hashlib.sha256((src / "interpose" / "hooks.def").read_bytes()).hexdigest()


def test_the_packaged_sources_are_found_through_importlib_resources() -> None:
    from importlib import resources

    from vgpu_patch.shim_build.sources import c_src_dir, find_hooks_def

    assert c_src_dir() == Path(str(resources.files("vgpu_patch") / "c_src")).resolve()
    assert find_hooks_def().is_file()
