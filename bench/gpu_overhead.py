#!/usr/bin/env python3
"""GPU benchmark (run on the H200 by the lead): host cost with vs without the shim, in one run.

Driver API part: bench/gpu_overhead.c against the real libcuda.so.1, alternately bare and with
LD_PRELOAD=libvgpu.so (CUDA_DEVICE_MEMORY_LIMIT set, so accounting is active): cuLaunchKernel of an
empty kernel in batches of 256 then a sync (host time of the launches only), cuMemAlloc+cuMemFree
of 1 MiB, cuMemGetInfo, cuCtxGetDevice and cuCtxGetCurrent (the driver's own cost: the shim passes
them through), and 4 KiB alloc+free pairs with 10 vs 100,000 live allocations. Rounds alternate
which mode goes first.

The 1 MiB pair takes tens of us in the driver and varies from process to process by more than the
shim's share, so besides the full rounds it gets --alloc-rounds short processes of its own (each
the median of blocks of 100 pairs); its figure is the median over all of them. --cpus pins each
Driver API run to the same CPUs (e.g. the GPU's NUMA node, from `nvidia-smi topo -m`).
PyTorch part (when torch with CUDA is installed): a decode-like loop, batch 1, 100 layers x 3
small kernels (~300 launches a step), steps/s bare vs shim, alternating processes.

Targets: launch added <= 50 ns and <= 2%; alloc+free <= 1.10x; cuMemGetInfo <= bare + 100 ns;
decode loop >= 0.995x.

    python3 bench/gpu_overhead.py [--rounds 5] [--alloc-rounds 10] [--scale 1.0] [--limit 40g] [--cpus 0-7]

Expected to take about 2 minutes on one H200 with the defaults (torch installed); the elapsed time is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from shim_overhead import collect, compile_bench, medians, report

from vgpu_patch.shim_build.build import build_shim

DECODE = r"""
import json, sys, time, torch
torch.manual_seed(0)
layers = [(torch.randn(1024, 1024, device="cuda", dtype=torch.float16),
           torch.randn(1024, device="cuda", dtype=torch.float16)) for _ in range(100)]
x = torch.randn(1, 1024, device="cuda", dtype=torch.float16)

def step(x):
    for w, b in layers:                      # 3 kernels a layer: matmul, add, activation
        x = torch.nn.functional.silu(x @ w + b)
    return x

for _ in range(20):
    step(x)
torch.cuda.synchronize()
steps, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[1]):
    for _ in range(10):
        step(x)
    torch.cuda.synchronize()
    steps += 10
print(json.dumps({"steps_per_s": steps / (time.perf_counter() - t0)}))
"""


def torch_available() -> bool:
    p = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"], capture_output=True)
    return p.returncode == 0


def decode_rounds(shim: Path, env: dict[str, str], rounds: int, seconds: float) -> dict[str, float]:
    runs: dict[str, list[float]] = {"bare": [], "shim": []}
    for r in range(rounds):
        for mode in ("bare", "shim") if r % 2 == 0 else ("shim", "bare"):
            e = dict(env)
            if mode == "shim":
                e["LD_PRELOAD"] = str(shim)
            p = subprocess.run([sys.executable, "-c", DECODE, str(seconds)], env=e, capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(f"decode loop ({mode}) failed: {p.stderr.strip()[-500:]}")
            runs[mode].append(json.loads(p.stdout.strip().splitlines()[-1])["steps_per_s"])
    out = {mode: statistics.median(v) for mode, v in runs.items()}
    # each round's bare and shim ran back to back: the median of those paired ratios shrugs off the
    # slow drift between processes that moves both medians by several percent
    out["paired_ratio"] = statistics.median(s / b for s, b in zip(runs["shim"], runs["bare"]))
    return out


def decode_report(shim: Path, env: dict[str, str], args: argparse.Namespace) -> None:
    if not torch_available():
        print("\nPyTorch decode loop: skipped (torch with CUDA not installed)")
        return
    rounds = args.decode_rounds or args.rounds
    dec = decode_rounds(shim, env, rounds, args.decode_seconds)
    print(f"\nPyTorch decode-like loop (batch 1, ~300 kernels/step, {rounds} paired rounds of "
          f"{args.decode_seconds:g} s), median steps/s: bare {dec['bare']:.1f}, shim {dec['shim']:.1f}, "
          f"ratio of medians {dec['shim'] / dec['bare']:.4f}, median paired ratio {dec['paired_ratio']:.4f} "
          f"(>= 0.995)")


def cpu_list(spec: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}"""
    cpus: set[int] = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--alloc-rounds", type=int, default=10,
                    help="extra short runs of the 1 MiB alloc+free pair only (default 10)")
    ap.add_argument("--cpus", default="", help="pin every run to these CPUs, e.g. 0-7 (default: not pinned)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--limit", default="40g", help="CUDA_DEVICE_MEMORY_LIMIT for the shim runs (default 40g)")
    ap.add_argument("--decode-seconds", type=float, default=3.0)
    ap.add_argument("--decode-rounds", type=int, default=None, help="decode loop rounds (default: --rounds)")
    ap.add_argument("--decode-only", action="store_true", help="run only the PyTorch decode loop")
    args = ap.parse_args()
    cpus = cpu_list(args.cpus) or None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vgpu-gpubench-") as d:
        tmp = Path(d)
        try:
            shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        except Exception:
            shim = build_shim(tmp / "shim").library
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))}
        env.update({"CUDA_DEVICE_MEMORY_LIMIT": args.limit, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / "cache")})
        if args.decode_only:
            decode_report(shim, env, args)
            print(f"\nelapsed {time.monotonic() - started:.0f} s")
            return
        exe = compile_bench(tmp)
        runs = collect(exe, shim, env, args.rounds, args.scale, cpus=cpus)
        extra = collect(exe, shim, env, args.alloc_rounds, args.scale, "alloc", cpus=cpus)
        for mode in runs:
            runs[mode] += extra[mode]
        med = medians(runs)
        cmd = (f"python3 bench/gpu_overhead.py --rounds {args.rounds} --alloc-rounds {args.alloc_rounds} "
               f"--scale {args.scale} --limit {args.limit}" + (f" --cpus {args.cpus}" if args.cpus else ""))
        report(med, f"real GPU, {args.rounds} rounds (+{args.alloc_rounds} for alloc_free_ns), median ns/op "
                    f"(command: {cmd})")
        added = med["shim"]["launch_ns"] - med["bare"]["launch_ns"]
        print(f"\ntargets: launch added {added:.1f} ns (<= 50) and "
              f"{100 * added / med['bare']['launch_ns']:.2f}% (<= 2%); "
              f"alloc+free {med['shim']['alloc_free_ns'] / med['bare']['alloc_free_ns']:.3f}x (<= 1.10); "
              f"cuMemGetInfo +{med['shim']['meminfo_ns'] - med['bare']['meminfo_ns']:.1f} ns (<= 100)")
        decode_report(shim, env, args)
    print(f"\nelapsed {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
