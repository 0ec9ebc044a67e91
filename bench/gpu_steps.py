#!/usr/bin/env python3
"""Decode-like steps on a real GPU (issue 34's table): one kernel, then cuStreamSynchronize, in a loop; steps per
second of one process under each SM charge and under MPS, over the same loop bare, with each step's latency.
Rows: the shim at SM 50 and 25 with VGPU_SM_CHARGE=time (the default) and =occupancy, MPS at 50 % and 25 %.
Each row is run --rounds times, alternating with a bare run (no shim, no MPS): the median ratio and the spread
(min-max) of the rounds, and the median p50 / p99 step latency.

    python3 bench/gpu_steps.py [--seconds 2] [--rounds 3] [--no-mps] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT))

from shares import build_region_gpu, mps_daemon

from vgpu_patch.shim_build.build import build_shim

# (name, blocks of 256 threads (0: four an SM, every SM), SPIN_ITERS): about 9 us, 21 us and 550 us steps on an
# H200 with 32 blocks, a quarter of its 132 SMs, and with every SM
SHAPES = [("32 blocks, short step", 32, 500), ("32 blocks, longer step", 32, 1900), ("every SM, long step", 0, 65000)]
ROWS = [("ours time 50", {"CUDA_DEVICE_SM_LIMIT": "50"}), ("ours time 25", {"CUDA_DEVICE_SM_LIMIT": "25"}),
        ("ours occupancy 50", {"CUDA_DEVICE_SM_LIMIT": "50", "VGPU_SM_CHARGE": "occupancy"}),
        ("ours occupancy 25", {"CUDA_DEVICE_SM_LIMIT": "25", "VGPU_SM_CHARGE": "occupancy"})]
MPS_ROWS = [("MPS 50 %", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}),
            ("MPS 25 %", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})]


def steps(exe: Path, seconds: float, blocks: int, iters: int, extra: dict[str, str]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_DEVICE_", "CUDA_MPS_", "GPU_CORE", "LD_PRELOAD", "VGPU_"))}
    env.update(SPIN_ITERS=str(iters), NCCL_NVLS_ENABLE="0", **({"SPIN_BLOCKS": str(blocks)} if blocks else {}),
               **extra)
    p = subprocess.run([str(exe), "steps", str(seconds)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return {k: float(v) for k, v in (line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-mps", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    table = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build_region_gpu(tmp / "region_gpu")
        shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        node = tmp / "node"
        node.mkdir()
        ours = {"LD_PRELOAD": str(shim), "VGPU_NODE_DIR": str(node)}
        pipe = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp / "mps"), "CUDA_MPS_LOG_DIRECTORY": str(tmp / "mps")}

        def measure(shape: str, name: str, blocks: int, iters: int, extra: dict[str, str]) -> None:
            ratios, p50s, p99s, bare_p50s = [], [], [], []
            for r in range(max(1, args.rounds)):
                bare = steps(exe, args.seconds, blocks, iters, {})  # without MPS too: a client needs its pipe
                got = steps(exe, args.seconds, blocks, iters,
                            {**extra, **({"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / f"{name}-{r}.cache")}
                                         if "LD_PRELOAD" in extra else {})})
                ratios.append(got["steps_per_s"] / bare["steps_per_s"])
                p50s.append(got["p50_us"])
                p99s.append(got["p99_us"])
                bare_p50s.append(bare["p50_us"])
            row = {"shape": shape, "row": name, "ratio": statistics.median(ratios), "min": min(ratios),
                   "max": max(ratios), "p50_us": statistics.median(p50s), "p99_us": statistics.median(p99s),
                   "bare_p50_us": statistics.median(bare_p50s)}
            table.append(row)
            print(f"  {name:<20} {row['ratio']:.3f}x ({row['min']:.3f}-{row['max']:.3f})   p50 {row['p50_us']:.0f} us"
                  f"  p99 {row['p99_us']:.0f} us  (p99/p50 {row['p99_us'] / row['p50_us']:.2f}; bare p50 "
                  f"{row['bare_p50_us']:.1f} us)", flush=True)

        for shape, blocks, iters in SHAPES:
            print(f"== {shape} (SPIN_BLOCKS={blocks or 'four an SM'}, SPIN_ITERS={iters})", flush=True)
            for name, extra in ROWS:
                measure(shape, name, blocks, iters, {**ours, **extra})
            if not args.no_mps:
                with mps_daemon(tmp):
                    for name, extra in MPS_ROWS:
                        measure(shape, name, blocks, iters, {**pipe, **extra})
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
