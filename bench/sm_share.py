#!/usr/bin/env python3
"""Compute shares on a real GPU, side by side: the shim's SM limits (one budget per container, each
container its own region) beside bare time-slicing and MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), for
a long-kernel (about 2.2 ms) and a short-kernel (about 29 us) compute-bound loop. Each figure is a
container's kernels per second over one bare process alone.

    python3 bench/sm_share.py [--seconds 3] [--no-mps] [--kernels long|short|both] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT))

from shares import LONG_ITERS, SHORT_ITERS, Container, ShareRunner, jain, mps_daemon

from vgpu_patch.shim_build.build import build_shim, header_dir

C = Container
ROWS: list[tuple[str, list[Container]]] = [
    ("one process, 50", [C(50)]),
    ("one process, 25", [C(25)]),
    ("one process, no limit (shim cost)", [C(None)]),
    ("one container, 2 processes, 50", [C(50, 2)]),
    ("one container, 3 processes, 30", [C(30, 3)]),
    ("two containers 50 / 50", [C(50), C(50)]),
    ("two containers 30 / 70", [C(30), C(70)]),
    ("two containers 25 / 25", [C(25), C(25)]),
    ("three containers 30 / 30 / 30", [C(30), C(30), C(30)]),
    ("50 beside an unlimited container", [C(50), C(None)]),
]
BARE = [("bare pair (time-slicing ceiling)", [C(None), C(None)]),
        ("bare trio", [C(None), C(None), C(None)])]
MPS = [("MPS 50 / 50", [C(50), C(50)]), ("MPS 30 / 70", [C(30), C(70)]),
       ("MPS 30 / 30 / 30", [C(30), C(30), C(30)])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-mps", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kernels", choices=["long", "short", "both"], default="both")
    args = ap.parse_args()
    table = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = tmp / "region_gpu"
        subprocess.run([os.environ.get("CC", "gcc"), "-O2", f"-I{header_dir()}",
                        str(ROOT / "c_src" / "tests" / "gpu" / "region_gpu.c"), "-o", str(exe), "-ldl"], check=True)
        shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        runner = ShareRunner(exe, shim, tmp, args.seconds)
        for iters, size in ((LONG_ITERS, "long"), (SHORT_ITERS, "short")):
            if args.kernels not in (size, "both"):
                continue
            print(f"== {size} kernels (SPIN_ITERS={iters}): bare {runner.bare(iters):.1f} kernels/s", flush=True)
            rows = [(n, c, "shim") for n, c in ROWS] + [(n, c, "bare") for n, c in BARE]
            for name, cs, how in rows:
                shares = runner.run(cs, iters, shim=how == "shim")
                table.append({"kernels": size, "row": name, "shares": shares})
                eq = len({c.limit for c in cs}) == 1 and len(cs) > 1
                print(f"  {name:<38} " + " / ".join(f"{s:.3f}" for s in shares)
                      + (f"   sum {sum(shares):.3f}" if len(cs) > 1 else "")
                      + (f"   Jain {jain(shares):.3f}" if eq else ""), flush=True)
            if not args.no_mps:
                with mps_daemon(tmp):
                    for name, cs in MPS:
                        shares = runner.run(cs, iters, shim=False, mps=True)
                        table.append({"kernels": size, "row": name, "shares": shares})
                        print(f"  {name:<38} " + " / ".join(f"{s:.3f}" for s in shares), flush=True)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
