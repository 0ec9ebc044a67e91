#!/usr/bin/env python3
"""Shim's added host cost on a real GPU, bare and shim measured in ONE process (see gpu_inprocess.c).

    python3 bench/gpu_inprocess.py [--shim out/libvgpu.so] [--rounds 41] [--limit 40g]

Prints, per metric, the median ns/op of the driver's own entry point and of the shim's, the difference
and the ratio, against the issue's targets. Builds the shim with `vgpu-patch build` when --shim is absent.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vgpu_patch.shim_build.build import build_shim, header_dir

TARGETS = {"launch_ns": "added <= 50 ns and <= 2%", "meminfo_ns": "added <= 100 ns",
           "pair_4k_ns": "ratio <= 1.10", "pair_1m_ns": "ratio <= 1.10"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", type=Path)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--limit", default="40g")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-ab-") as tmp_s:
        tmp = Path(tmp_s)
        shim = args.shim.resolve() if args.shim else build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        exe = tmp / "ab"
        subprocess.run(["gcc", "-O2", "-Wall", f"-I{header_dir()}", str(HERE / "gpu_inprocess.c"), "-o", str(exe),
                        "-ldl"], check=True)
        env = dict(os.environ, LD_PRELOAD=str(shim), CUDA_DEVICE_MEMORY_LIMIT=args.limit,
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / "cache"))
        p = subprocess.run([str(exe), str(args.rounds)], env=env, capture_output=True, text=True, timeout=600)
        if p.returncode:
            print(p.stderr, file=sys.stderr)
            return p.returncode
        res = json.loads(p.stdout)
    print(f"real GPU, one process, {args.rounds} alternating rounds, median ns/op "
          f"(command: python3 bench/gpu_inprocess.py --rounds {args.rounds} --limit {args.limit})")
    print(f"{'metric':<14}{'driver ns':>12}{'shim ns':>12}{'added ns':>11}{'ratio':>8}   target")
    for name, (bare, shim_ns) in res.items():
        print(f"{name:<14}{bare:>12.1f}{shim_ns:>12.1f}{shim_ns - bare:>11.1f}{shim_ns / bare:>8.3f}   {TARGETS[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
