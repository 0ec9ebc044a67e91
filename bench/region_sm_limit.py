#!/usr/bin/env python3
"""SM limiter throughput ratios: the limiter (c_src/limiter/limiter.c) over a simulated GPU, and,
with --gpu, the real compute-bound loop (vgpu_patch/gpubench/region_gpu.c, as tests/gpu runs it) under the shim.

Prints kernels/s as a fraction of the unlimited run for CUDA_DEVICE_SM_LIMIT = none, 100, 75, 50, 25,
for three loop shapes over the simulation: async (sync every 32 launches), sync (after every
launch), sparse (20% duty: must stay unthrottled under 50%).

    python3 bench/region_sm_limit.py [--kernel-us 1000] [--count 500] [--gpu --seconds 4]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "region"))
sys.path.insert(0, str(ROOT))

from regiontools import C_SRC, CFLAGS, LIMITER_SOURCES, REGION_SOURCES

from vgpu_patch.gpubench.program import build_region_gpu
from vgpu_patch.shim_build.build import build_shim, header_dir

LIMITS = [None, "100", "75", "50", "25"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPU_CORE", "LD_PRELOAD"))}
    env.update(extra)
    return env


def sim_rows(tmp: Path, kernel_us: int, count: int) -> None:
    exe = tmp / "limiter_sim"
    srcs = [C_SRC / "tests" / "limiter" / "limiter_sim.c", *LIMITER_SOURCES, *REGION_SOURCES]
    subprocess.run([shutil.which("gcc") or "cc", *CFLAGS, f"-I{header_dir()}", *map(str, srcs), "-o", str(exe),
                    "-lpthread"], check=True)
    print(f"simulated GPU, {count} kernels of {kernel_us} us; throughput vs no limit")
    print(f"{'loop':<8}" + "".join(f"{'SM=' + (s or 'none'):>10}" for s in LIMITS))
    for mode in ("async", "sync", "sparse"):
        vals = []
        for lim in LIMITS:
            env = clean_env(**({"CUDA_DEVICE_SM_LIMIT": lim} if lim else {}))
            out = subprocess.run([str(exe), mode, str(kernel_us), str(count)], env=env, capture_output=True,
                                 text=True, check=True).stdout
            kv = dict(item.split("=") for item in out.split())
            vals.append(float(kv["gpu_ms"]) / float(kv["wall_ms"]))
        print(f"{mode:<8}" + "".join(f"{v / vals[0]:10.3f}" for v in vals))


def gpu_rows(tmp: Path, seconds: str) -> None:
    exe = build_region_gpu(tmp / "region_gpu")
    shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library

    def kps(preload: bool, **extra: str) -> float:
        env = clean_env(CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / f"cache-{os.urandom(4).hex()}"), **extra)
        if preload:
            env["LD_PRELOAD"] = str(shim)
        out = subprocess.run([str(exe), "loop", seconds], env=env, capture_output=True, text=True, check=True).stdout
        return float(dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)["kernels_per_s"])

    bare = kps(False)
    print(f"real GPU, compute-bound loop, {seconds} s each: bare {bare:.1f} kernels/s")
    for lim in LIMITS:
        v = kps(True, **({"CUDA_DEVICE_SM_LIMIT": lim} if lim else {}))
        print(f"  shim SM={lim or 'none':<5} {v:10.1f} kernels/s  {v / bare:6.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel-us", type=int, default=1000)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--gpu", action="store_true", help="also run the real-GPU loop (needs libcuda.so.1)")
    ap.add_argument("--seconds", default="4")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        sim_rows(Path(d), args.kernel_us, args.count)
        if args.gpu:
            gpu_rows(Path(d), args.seconds)


if __name__ == "__main__":
    main()
