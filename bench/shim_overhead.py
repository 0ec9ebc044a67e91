#!/usr/bin/env python3
"""CPU benchmark of the shim over the fake driver: host cost per call, bare vs LD_PRELOAD=libvgpu.so.

Runs bench/gpu_overhead.c (built with -DFAKE_DRIVER) alternately without and with the shim,
several rounds, and prints the median ns/op of each, the difference and the ratio:
cuLaunchKernel, a cuMemAlloc+cuMemFree pair, cuMemGetInfo, cuCtxGetDevice and cuCtxGetCurrent
(passed through: the driver's own cost), and an alloc+free pair with 10 vs 100,000 other
allocations alive (free must stay O(1)). The order alternates each round (bare first, then shim
first), so neither mode always runs on a warmer machine. The fake driver's calls cost a few ns,
so ratios here are an upper bound of what a real driver (microseconds per allocation) shows.

    python3 bench/shim_overhead.py [--rounds 5] [--scale 1.0] [--devices 1]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vgpu_patch.shim_build.build import build_shim, header_dir

METRICS = ["launch_ns", "alloc_free_ns", "meminfo_ns", "ctx_get_device_ns", "ctx_get_current_ns", "pair_10_live_ns",
           "pair_100k_live_ns"]


def compile_bench(out: Path, *defines: str) -> Path:
    exe = out / "gpu_overhead"
    cc = ["gcc"] if shutil.which("gcc") else [sys.executable, "-m", "ziglang", "cc"]
    subprocess.run(cc + ["-O2", "-Wall", "-Wextra", "-Werror", *[f"-D{d}" for d in defines], f"-I{header_dir()}",
                    str(REPO / "bench" / "gpu_overhead.c"), "-o", str(exe), "-ldl"], check=True)
    return exe


def collect(exe: Path, shim: Path, env: dict[str, str], rounds: int, scale: float, *args: str,
            cpus: set[int] | None = None) -> dict[str, list[dict[str, float]]]:
    """Every run's JSON, per mode. Rounds alternate which mode goes first (ABBA...)."""
    results: dict[str, list[dict[str, float]]] = {"bare": [], "shim": []}
    for r in range(rounds):
        for mode in ("bare", "shim") if r % 2 == 0 else ("shim", "bare"):
            e = dict(env)
            if mode == "shim":
                e["LD_PRELOAD"] = str(shim)
            pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
            p = subprocess.run([str(exe), str(scale), *args], env=e, capture_output=True, text=True, check=False,
                               preexec_fn=pin)
            if p.returncode:
                raise SystemExit(f"{mode} run failed ({p.returncode}): {p.stderr.strip()}")
            results[mode].append(json.loads(p.stdout.strip().splitlines()[-1]))
    return results


def medians(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {mode: {m: statistics.median(r[m] for r in runs if m in r) for m in METRICS}
            for mode, runs in results.items()}


def run_rounds(exe: Path, shim: Path, env: dict[str, str], rounds: int, scale: float,
               cpus: set[int] | None = None) -> dict[str, dict[str, float]]:
    """Alternate bare / shim runs; median of each metric."""
    return medians(collect(exe, shim, env, rounds, scale, cpus=cpus))


def report(med: dict[str, dict[str, float]], title: str) -> None:
    print(f"\n{title}")
    print(f"{'metric':<20}{'bare ns':>12}{'shim ns':>12}{'added ns':>12}{'ratio':>9}")
    for m in METRICS:
        b, s = med["bare"][m], med["shim"][m]
        print(f"{m:<20}{b:>12.1f}{s:>12.1f}{s - b:>12.1f}{s / b:>9.3f}")
    flat = med["shim"]["pair_100k_live_ns"] / med["shim"]["pair_10_live_ns"]
    print(f"{'free flatness':<20}{'':>12}{'':>12}{'':>12}{flat:>9.3f}  (shim pair cost, 100k live / 10 live)")


def build_fake(out: Path) -> Path:
    for src, soname in (("fake_cuda.c", "libcuda.so.1"), ("fake_nvml.c", "libnvidia-ml.so.1")):
        subprocess.run(["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", f"-I{header_dir()}", "-Wl,-Bsymbolic",
                        f"-Wl,-soname,{soname}", str(REPO / "tests" / "fake_driver" / src), "-o", str(out / soname),
                        "-lpthread"], check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--limit", default="50g", help="CUDA_DEVICE_MEMORY_LIMIT for the shim runs (default 50g)")
    ap.add_argument("--devices", type=int, default=1,
                    help="devices the fake driver shows (default 1, like the one-GPU bench machine)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as d:
        tmp = Path(d)
        shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        fake = build_fake(tmp)
        exe = compile_bench(tmp, "FAKE_DRIVER")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))}
        env.update({"LD_LIBRARY_PATH": str(fake), "FAKE_CUDA_MEM_MB": "100000", "CUDA_DEVICE_MEMORY_LIMIT": args.limit,
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / "cache"), "FAKE_CUDA_DEVICES": str(args.devices)})
        med = run_rounds(exe, shim, env, args.rounds, args.scale)
    report(med, f"fake driver, {args.rounds} rounds, median ns/op (command: python3 bench/shim_overhead.py "
                f"--rounds {args.rounds} --scale {args.scale} --devices {args.devices})")


if __name__ == "__main__":
    main()
