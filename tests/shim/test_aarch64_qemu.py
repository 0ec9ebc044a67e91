"""The aarch64 build at runtime: the shim (zig, default glibc floor), the fake driver and a probe
are cross-built for aarch64 and run under qemu-aarch64 with the Debian arm64 sysroot. Proves the
aarch64 trampolines (slow and fast path; x0-x7, stack arguments, d0-d7 and the x8 result pointer),
the memory limit, cuMemGetInfo_v2, cuGetProcAddress and dlsym(RTLD_NEXT/handle) on that arch.
Skips when qemu-aarch64 or the sysroot is missing (Debian: apt-get install qemu-user libc6-arm64-cross)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu_patch.shim_build.build import build_shim, header_dir

HERE = Path(__file__).resolve().parent
FAKE_SRC = HERE.parent / "fake_driver"
SYSROOT = Path(os.environ.get("VGPU_AARCH64_SYSROOT", "/usr/aarch64-linux-gnu"))
TARGET = "aarch64-linux-gnu.2.28"
MiB = 1 << 20


def _qemu() -> str:
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not qemu:
        pytest.skip("qemu-aarch64 not installed (apt-get install qemu-user)")
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        pytest.skip(f"no aarch64 sysroot at {SYSROOT} (apt-get install libc6-arm64-cross)")
    return qemu


def _zig(*args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", TARGET, *args], capture_output=True,
                       text=True)
    if p.returncode:
        raise AssertionError(f"zig cc {' '.join(args)} failed:\n{p.stderr}")


@pytest.fixture(scope="module")
def arm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Everything cross-built once: the fake driver (plus fake_wide.c), the probe, the shim."""
    qemu = _qemu()
    out = tmp_path_factory.mktemp("aarch64")
    fake = out / "fake"
    fake.mkdir()
    common = ["-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{header_dir()}",
              "-Wl,-Bsymbolic", "-lpthread"]
    _zig(*common, "-Wl,-soname,libcuda.so.1", str(FAKE_SRC / "fake_cuda.c"), str(HERE / "aarch64" / "fake_wide.c"),
         "-o", str(fake / "libcuda.so.1"))
    _zig(*common, "-Wl,-soname,libnvidia-ml.so.1", str(FAKE_SRC / "fake_nvml.c"), "-o",
         str(fake / "libnvidia-ml.so.1"))
    probe = out / "probe"
    _zig("-O1", "-Wall", "-Wextra", "-Werror", "-pthread", f"-I{header_dir()}", str(HERE / "aarch64" / "probe.c"),
         str(fake / "libcuda.so.1"), "-ldl", "-o", str(probe))
    shim = build_shim(out / "shim", arch="aarch64").library
    return {"qemu": Path(qemu), "fake": fake, "probe": probe, "shim": shim, "tmp": out}


def _run(arm: dict[str, Path], mode: str, extra: dict[str, str] | None = None, preload: bool = True) -> dict[str, str]:
    # the guest gets its variables through -E: LD_PRELOAD in qemu's own (x86_64) environment would
    # be applied to qemu itself
    host = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "CUDA_DEVICE_", "FAKE_CUDA_", "QEMU_"))}
    guest = {"LD_LIBRARY_PATH": str(arm["fake"]),
             "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(arm["tmp"] / f"cache-{os.urandom(6).hex()}")}
    if preload:
        guest["LD_PRELOAD"] = str(arm["shim"])
    guest.update(extra or {})
    cmd = [str(arm["qemu"]), "-L", str(SYSROOT)]
    for k, v in guest.items():
        cmd += ["-E", f"{k}={v}"]
    # cwd: a crashing guest leaves its qemu_*.core there, not in the checkout
    p = subprocess.run(cmd + [str(arm["probe"]), mode], env=host, cwd=arm["tmp"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    res = {}
    for line in p.stdout.splitlines():
        for part in line.split(" "):
            k, _, v = part.partition("=")
            res[k] = v
    return res


def test_probe_is_aarch64(arm: dict[str, Path]) -> None:
    for f in (arm["probe"], arm["shim"], arm["fake"] / "libcuda.so.1"):
        assert f.read_bytes()[18:20] == (183).to_bytes(2, "little"), f  # e_machine EM_AARCH64


# the wide call's checks, identical on its slow-path (first) and fast-path calls
WIDE = {"ints": "1", "doubles": "1", "tag": "77696465",
        "dsum": f"{1.5 - 2.25 + 3.125 + 1e10 - 5e-3 + 6.0 + 7.75 + 1024.5:.4f}"}  # summed in probe.c's order


def _common(r: dict[str, str], again_calls: str) -> None:
    assert r["wide_at"] == "libvgpu.so"
    assert {k: r[f"again_{k}"] for k in WIDE} == WIDE and r["again_calls"] == again_calls
    assert r["init"] == "0" and r["count_rc"] == "0" and r["count"] == "2"
    assert r["memset_rc"] == "777"
    assert r["memset_args"] == "1111222233334444,5555,66667777,8888,9999,abcdef"
    assert r["retain"] == "0" and r["set"] == "0"
    # the limit: 64 MiB reported and enforced (a second 48 MiB block is CUDA_ERROR_OUT_OF_MEMORY)
    assert r["info_rc"] == "0" and r["total"] == str(64 * MiB) and r["free"] == str(64 * MiB)
    assert (r["alloc1"], r["alloc2"], r["info2_rc"], r["free2"]) == ("0", "2", "0", str(16 * MiB))
    assert (r["free1"], r["alloc3"], r["free3"]) == ("0", "0", "0")
    assert r["launch_rc"] == "0" and r["launch_calls"] == "1"  # 11 arguments, 3 on the stack
    assert r["gpa_rc"] == "0" and r["gpa"] == "libvgpu.so"
    assert (r["h_alloc"], r["h_pass"], r["default_alloc"]) == ("libvgpu.so", "libcuda.so.1", "libvgpu.so")
    assert (r["next_alloc"], r["next_fake"], r["next_missing"]) == ("libvgpu.so", "libcuda.so.1", "NULL")
    assert r["next_puts_is_libc"] == "1"
    assert (r["nvml_init"], r["nvml_handle"], r["nvml_mem"]) == ("0", "0", "0")
    assert r["nvml_init_at"] == "libvgpu.so"  # NVML's first call also takes a trampoline's slow path
    assert r["nvml_total"] == str(64 * MiB) and r["nvml_mem_at"] == "libvgpu.so"


def test_wide_pass_call_first_takes_the_slow_path(arm: dict[str, Path]) -> None:
    r = _run(arm, "wide", {"CUDA_DEVICE_MEMORY_LIMIT": "64m"})
    assert {k: r[f"first_{k}"] for k in WIDE} == WIDE and r["first_calls"] == "1"
    _common(r, "2")


def test_plain_pass_call_first(arm: dict[str, Path]) -> None:
    r = _run(arm, "count", {"CUDA_DEVICE_MEMORY_LIMIT": "64m"})
    assert r["first_count_rc"] == "3"  # CUDA_ERROR_NOT_INITIALIZED from the real (fake) driver
    _common(r, "1")


def test_without_the_shim_nothing_is_limited(arm: dict[str, Path]) -> None:
    r = _run(arm, "count", {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}, preload=False)
    assert r["wide_at"] == "libcuda.so.1" and r["total"] == str(1024 * MiB) and r["alloc2"] == "0"
    assert r["nvml_total"] == str(1024 * MiB) and r["nvml_mem_at"] == "libnvidia-ml.so.1"


def test_first_calls_race_from_many_threads(arm: dict[str, Path]) -> None:
    for _ in range(3):
        assert _run(arm, "race")["race_bad"] == "0"
