"""GPU fixtures: skip cleanly unless a real NVIDIA driver is present; build the shim on that machine."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def driver_present() -> str | None:
    """None when a GPU is usable, else why not (what `vgpu-patch bench` would say)."""
    from vgpu_patch.gpubench.driver import probe
    from vgpu_patch.report.errors import GpuError

    try:
        probe()
    except GpuError as e:
        return str(e)
    return None


@dataclass
class Gpu:
    shim: Path
    probe: Path
    tmp: Path

    def env(self, limit: str | None, preload: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_MEMORY_LIMIT", "LD_PRELOAD"))}
        if preload:
            env["LD_PRELOAD"] = str(self.shim)
        if limit is not None:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = limit
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(self.tmp / f"cache-{os.urandom(4).hex()}")
        env.update(extra)
        return env

    def probe_run(self, mode: str, limit: str | None) -> dict[str, str]:
        p = subprocess.run([str(self.probe), mode], env=self.env(limit), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"probe {mode} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
        return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)

    def python(self, code: str, limit: str | None, preload: bool = True, timeout: float = 300):
        return subprocess.run([sys.executable, "-c", code], env=self.env(limit, preload), capture_output=True,
                              text=True, timeout=timeout)


@pytest.fixture(scope="session")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> Gpu:
    why = driver_present()
    if why:
        pytest.skip(why)
    from vgpu_patch.shim_build.build import build_shim, header_dir

    tmp = tmp_path_factory.mktemp("gpu")
    try:
        shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
    except Exception:  # no gcc on the GPU host: the default toolchain (zig) then
        shim = build_shim(tmp / "shim").library
    probe = tmp / "probe"
    cc = [os.environ["CC"]] if os.environ.get("CC") else ["gcc"] if shutil.which("gcc") else [
        sys.executable, "-m", "ziglang", "cc"]
    subprocess.run(cc + ["-O2", "-Wall", f"-I{header_dir()}", str(HERE / "probe.c"), "-o", str(probe), "-ldl",
                         "-lpthread"], check=True)
    return Gpu(shim, probe, tmp)


@pytest.fixture(scope="session")
def region_gpu(gpu: Gpu) -> Path:
    """vgpu_patch/gpubench/region_gpu.c: holds or loops on the real driver for the region tests."""
    from vgpu_patch.gpubench.program import build_region_gpu

    return build_region_gpu(gpu.tmp / "region_gpu")


def kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def start_hold(exe: Path, env: dict[str, str], mib: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """`region_gpu hold MIB` in the background, once it has allocated and printed `ready=1`."""
    p = subprocess.Popen([str(exe), "hold", str(mib)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    lines = []
    while True:
        line = p.stdout.readline()
        if not line:
            raise AssertionError(f"hold exited early: {p.stderr.read()}")
        lines.append(line)
        if line.startswith("ready="):
            return p, kv("".join(lines))
