#!/usr/bin/env python3
"""A matmul loop with region_gpu's `loop` protocol, so vgpu_patch/gpubench/shares.py can run it as a container:

    matmul_loop.py loop SECONDS     SPIN_ITERS: the square matrices' side (1024: about 60 us a matmul,
                                    float32, on an H200); syncs every 8 matmuls; LOOP_START_AT and
                                    LOOP_WINDOW as region_gpu.c reads them

Prints kernels_per_s (matmuls per second) and, with LOOP_WINDOW, window_kernels_per_s."""
from __future__ import annotations

import os
import sys
import time

import torch


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] != "loop":
        print("usage=matmul_loop.py loop SECONDS")
        return 2
    seconds = float(sys.argv[2])
    n = int(os.environ.get("SPIN_ITERS", "1024"))
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    for _ in range(16):  # warm-up: cuBLAS's handle and kernel choice
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    start_at = float(os.environ.get("LOOP_START_AT", "0"))
    while time.monotonic() < start_at:
        time.sleep(0.001)
    w0, w1 = (float(x) for x in os.environ.get("LOOP_WINDOW", "1e300,-1").split(","))
    first_at = last_at = -1.0
    first_n = last_n = launched = 0
    t0 = t1 = time.monotonic()
    while t1 - t0 < seconds:
        torch.matmul(a, b, out=c)
        launched += 1
        if launched % 8 == 0:
            torch.cuda.synchronize()
            t1 = time.monotonic()
            if t1 >= w0 and first_at < 0:
                first_at, first_n = t1, launched
            if t1 <= w1:
                last_at, last_n = t1, launched
    torch.cuda.synchronize()
    t1 = time.monotonic()
    print(f"kernels={launched}\nseconds={t1 - t0:.3f}\nkernels_per_s={launched / (t1 - t0):.2f}")
    if first_at >= 0 and last_at > first_at:
        print(f"window_kernels_per_s={(last_n - first_n) / (last_at - first_at):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
