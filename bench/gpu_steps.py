#!/usr/bin/env python3
"""Decode-like steps on a real GPU (issue 34's table): one kernel, then cuStreamSynchronize, in a loop; steps per
second of one process under each SM charge and under MPS, over the same loop bare, with each step's latency.
Rows: the shim at SM 50 and 25 with VGPU_SM_CHARGE=time (the default) and =occupancy, MPS at 50 % and 25 %.
Each row is run --rounds times, alternating with a bare run (no shim, no MPS): the median ratio and the spread
(min-max) of the rounds, and the median p50 / p99 step latency. `vgpu-patch bench` runs the same rows
(vgpu_patch/gpubench/steps.py) on any node, beside a bare row.

    python3 bench/gpu_steps.py [--seconds 2] [--rounds 3] [--no-mps] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vgpu_patch.gpubench.mps import mps_daemon, mps_env
from vgpu_patch.gpubench.program import Shim, build_region_gpu
from vgpu_patch.gpubench.steps import SHAPES, StepsRow, charge_rows, measure_steps, mps_rows
from vgpu_patch.shim_build.build import build_shim

LIMITS = [50, 25]


def show(row: StepsRow) -> None:
    p50, p99 = row.median("p50_us"), row.median("p99_us")
    print(f"  {row.row:<20} {row.ratio.median:.3f}x ({row.ratio.min:.3f}-{row.ratio.max:.3f})   p50 {p50:.0f} us"
          f"  p99 {p99:.0f} us  (p99/p50 {p99 / p50:.2f}; bare p50 {row.median('bare_p50_us'):.1f} us, p99/p50 "
          f"{row.median('bare_p99_us') / row.median('bare_p50_us'):.2f})", flush=True)


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
        shim = Shim(build_shim(tmp / "shim", compiler="gcc", glibc=None).library, tmp)
        for shape in SHAPES:
            print(f"== {shape.name} (SPIN_BLOCKS={shape.blocks or 'four an SM'}, SPIN_ITERS={shape.iters})",
                  flush=True)
            for name, extra in charge_rows(LIMITS):
                table.append(measure_steps(exe, args.seconds, shape, name, partial(shim.env, extra), args.rounds))
                show(table[-1])
            if not args.no_mps:
                with mps_daemon(tmp):
                    for name, extra in mps_rows(LIMITS):
                        table.append(measure_steps(exe, args.seconds, shape, name, partial(dict, mps_env(tmp), **extra),
                                             args.rounds))
                        show(table[-1])
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in table], indent=1))


if __name__ == "__main__":
    main()
