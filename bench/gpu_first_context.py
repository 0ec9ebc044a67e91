#!/usr/bin/env python3
"""What charging the context costs at start-up: cuInit + the first primary-context retain, bare and
under the shim with a limit (which measures the context through NVML), in fresh processes,
alternating, on a real GPU.

    python3 bench/gpu_first_context.py --shim out/libvgpu.so [--rounds 7] [--limit 4g]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import ctypes, time
cu = ctypes.CDLL("libcuda.so.1")
t0 = time.perf_counter()
assert cu.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
print((time.perf_counter() - t0) * 1e3)
"""


def one(env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--limit", default="4g")
    args = ap.parse_args()
    bare_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    shim_env = dict(bare_env, LD_PRELOAD=str(args.shim.resolve()), CUDA_DEVICE_MEMORY_LIMIT=args.limit,
                    CUDA_DEVICE_MEMORY_SHARED_CACHE=f"/tmp/vgpu-bench-ctx-{os.getpid()}")
    bare, shim = [], []
    for i in range(args.rounds):
        order = [(bare, bare_env), (shim, shim_env)] if i % 2 == 0 else [(shim, shim_env), (bare, bare_env)]
        for sink, env in order:
            sink.append(one(env))
    b, s = statistics.median(bare), statistics.median(shim)
    print(f"first context (cuInit + primary retain), {args.rounds} rounds, median ms")
    print(f"bare {b:.1f}   shim with limit {s:.1f}   added {s - b:+.1f} ms   ratio {s / b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
