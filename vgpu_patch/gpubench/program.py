"""region_gpu.c, the GPU program every measurement runs: building it, the environment a measured process starts
with (bare, or as a container under the shim), and reading what it prints (key=value lines).

region_gpu loads the driver with dlopen("libcuda.so.1") and JIT-compiles its kernels from PTX there, so building
it needs only a C compiler and the CUDA headers, no nvcc and no CUDA toolkit on the node."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from ..report import verbosity
from ..report.errors import BuildError, GpuError

# package data, so an installed wheel has it as a checkout does
REGION_GPU_C = Path(str(resources.files("vgpu_patch") / "gpubench" / "region_gpu.c"))
# SPIN_ITERS of the compute-bound loop: about 2.2 ms and 29 us a kernel on an H200
LONG_ITERS, SHORT_ITERS = 1 << 18, 3000
# what a measured process must not inherit from the caller's shell (the shim's, HAMi's and MPS's settings, and
# region_gpu's own knobs): each run sets those it means
NOT_INHERITED = ("CUDA_DEVICE_", "CUDA_MPS_", "CUDA_TASK_PRIORITY", "GPU_CORE", "LD_PRELOAD", "VGPU_", "SPIN_",
                 "LOOP_", "COLD_")


def build_region_gpu(out: Path, cc: str | None = None) -> Path:
    """region_gpu.c compiled to `out` by `cc` (default: $CC, else gcc)"""
    from ..shim_build.build import header_dir
    from ..shim_build.toolchain import install_hint

    cc = cc or os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise BuildError(f"compiler {cc!r} not found (not on PATH, not an executable file): {install_hint()}")
    argv = [cc, "-O2", "-Wall", f"-I{header_dir()}", str(REGION_GPU_C), "-o", str(out), "-ldl"]
    with verbosity.step("bench", f"compiling {REGION_GPU_C.name}", verbosity.describe(shlex.join(argv))):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode:
        lines = [ln.strip() for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "no output")
        raise BuildError(f"compiling {REGION_GPU_C.name} failed: {first} (command: {shlex.join(argv)})")
    return out


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without NOT_INHERITED, plus `extra`"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
    env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off, as in every GPU run here (a PyTorch container may load NCCL)
    env.update(extra or {})
    return env


class Shim:
    """The shim as a container runs it: the library preloaded, the node's activity board in one directory every
    container shares (HAMi mounts /tmp/vgpulock there), and a region file of its own."""

    def __init__(self, library: Path, tmp: Path) -> None:
        self.library, self.tmp = library, tmp
        self.node = tmp / "node"
        self.node.mkdir(parents=True, exist_ok=True)
        self._tag, self._made = os.urandom(3).hex(), 0

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What one container's processes add to their environment: a new region on each call (a container that
        just started), never the shim's default /tmp/cudevshr.cache"""
        self._made += 1
        return {"LD_PRELOAD": str(self.library), "VGPU_NODE_DIR": str(self.node),
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(self.tmp / f"{self._tag}-{self._made}.cache"), **(extra or {})}


def parse_kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def result(what: str, cmd: str, rc: int, out: str, err: str) -> dict[str, str]:
    """A finished run's key=value lines, or GpuError (one line: what ran, how it ended, what it said)"""
    kv = parse_kv(out)
    if rc == 0:
        return kv
    said = ", ".join(f"{k}={v}" for k, v in kv.items()) or " / ".join(err.split("\n")[-3:]).strip() or "no output"
    raise GpuError(f"{what}: `{cmd}` exited {rc} ({said[:300]}); check that nvidia-smi shows the GPU healthy and "
                   "idle, then run again with -v")


def run(exe: Path, mode: str, arg: str, env: dict[str, str], what: str, timeout: float = 120) -> dict[str, str]:
    """`exe mode arg` to its end, in `env` (a whole environment: clean_env's)"""
    cmd = f"{exe.name} {mode} {arg}"
    with verbosity.step("bench", what, cmd):
        try:
            p = subprocess.run([str(exe), mode, arg], env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GpuError(f"{what}: `{cmd}` still ran after {timeout:.0f} s: is the GPU hung or held by other "
                           "work? (nvidia-smi)") from None
    return result(what, cmd, p.returncode, p.stdout, p.stderr)
