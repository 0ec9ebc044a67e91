"""Compute shares on a real GPU: containers (each its own region file) of one or more processes
running c_src/tests/gpu/region_gpu.c's compute-bound loop at once, under the shim or under MPS.

A share is a container's kernels per second over what one process alone, without the shim, gets
with the same kernels. Used by tests/gpu/test_sm_share_gpu.py and bench/sm_share.py."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

LONG_ITERS, SHORT_ITERS = 1 << 18, 3000  # about 2.2 ms and 29 us a kernel on an H200
REGION_GPU_C = Path(__file__).resolve().parents[2] / "c_src" / "tests" / "gpu" / "region_gpu.c"


def build_region_gpu(out: Path) -> Path:
    """c_src/tests/gpu/region_gpu.c compiled to `out` (CC or gcc): the program every GPU share test and bench runs"""
    from vgpu_patch.shim_build.build import header_dir

    subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-Wall", f"-I{header_dir()}", str(REGION_GPU_C), "-o", str(out),
                    "-ldl"], check=True)
    return out


@dataclass
class Container:
    limit: int | None  # CUDA_DEVICE_SM_LIMIT (or the MPS thread percentage); None: none
    procs: int = 1
    arrives: float = 0.0  # seconds after the first container's loop began (a pod that starts later)
    env: dict[str, str] = field(default_factory=dict)  # more of its environment (CUDA_TASK_PRIORITY, say)


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


class ShareRunner:
    def __init__(self, exe: Path, shim: Path, tmp: Path, seconds: float = 3.0, lead: float = 2.5) -> None:
        """`lead`: seconds from starting the processes to their loops' common start, time enough for every
        process to have its context (a PyTorch process takes longer)"""
        self.exe, self.shim, self.tmp, self.seconds, self.lead = exe, shim, tmp, seconds, lead
        self.node = tmp / "node"  # the activity board's directory (HAMi mounts /tmp/vgpulock there)
        self.node.mkdir(parents=True, exist_ok=True)
        self._bare: dict[int, float] = {}

    def _env(self, iters: int, start_at: float, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CUDA_DEVICE_", "CUDA_MPS_", "GPU_CORE", "LD_PRELOAD", "VGPU_"))}
        env.update(SPIN_ITERS=str(iters), LOOP_START_AT=f"{start_at:.3f}", NCCL_NVLS_ENABLE="0", **extra)
        return env

    def run(self, containers: list[Container], iters: int, shim: bool = True, mps: bool = False,
            trace: Path | None = None) -> list[float]:
        """Every process of every container, each container's loop beginning `arrives` seconds after the first
        one's; each container's share of a lone bare process over one common window that opens a second after
        the last arrival (so a late container meets the others busy, as a pod that starts later does).
        `trace`: a directory where each process writes its kernels' timeline (c<container>p<process>.txt)."""
        start_at = time.monotonic() + self.lead  # after every process has its context
        last = max(c.arrives for c in containers)
        window = (start_at + last + 1.0, start_at + last + 1.0 + self.seconds) if last else None
        tag = os.urandom(3).hex()
        procs: list[tuple[int, subprocess.Popen]] = []
        for c, spec in enumerate(containers):
            extra: dict[str, str] = {}
            if shim:
                extra.update(LD_PRELOAD=str(self.shim), VGPU_NODE_DIR=str(self.node),
                             CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.tmp / f"{tag}-c{c}.cache"))
                if spec.limit:
                    extra["CUDA_DEVICE_SM_LIMIT"] = str(spec.limit)
            if mps:
                pipe = str(self.tmp / "mps")
                extra.update(CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=pipe)
                if spec.limit:
                    extra["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(spec.limit)
            extra.update(spec.env)
            if window:
                extra["LOOP_WINDOW"] = f"{window[0]:.3f},{window[1]:.3f}"
            begin = start_at + spec.arrives
            seconds = window[1] + 0.2 - begin if window else self.seconds
            for i in range(spec.procs):
                env = self._env(iters, begin, extra)
                if trace:
                    env["LOOP_TRACE"] = str(trace / f"c{c}p{i}.txt")
                p = subprocess.Popen([str(self.exe), "loop", f"{seconds:.3f}"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                procs.append((c, p))
        rates = [0.0] * len(containers)
        try:
            for c, p in procs:
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, f"region_gpu loop exited {p.returncode}: {out}{err}"
                kv = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
                rates[c] += float(kv["window_kernels_per_s" if window else "kernels_per_s"])
        finally:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        bare = self.bare(iters)
        return [r / bare for r in rates]

    def bare(self, iters: int) -> float:
        """One process alone, without the shim: the 1.0 every share is measured against."""
        if iters not in self._bare:
            self._bare[iters] = 1.0
            self._bare[iters] = max(self.run([Container(None)], iters, shim=False)[0] for _ in range(2))
        return self._bare[iters]


@contextlib.contextmanager
def mps_daemon(tmp: Path):
    """nvidia-cuda-mps-control -d for the block; quit afterwards, whatever happens."""
    d = tmp / "mps"
    d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(d), "CUDA_MPS_LOG_DIRECTORY": str(d)}
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=60)
    try:
        yield
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=60)
        time.sleep(1)
