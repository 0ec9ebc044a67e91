#!/usr/bin/env python3
"""Cost of a launch under CUDA_DEVICE_SM_LIMIT, over the fake driver (no GPU needed), beside the
build before issue 11 (68e8a26) in one run.

bench/shim_cost.c launches N kernels after one allocation (the region attached), with
LD_PRELOAD=libvgpu.so over tests/fake_driver linked with fake_events.c (events that are 0 ms apart:
the limiter measures but never sleeps, so what is left is its own cost). Prints, per build: driver
calls per launch beyond the launch itself (counted by the fake driver) and host ns per launch,
without and with an SM limit, and the ratios. On the H200 the same loop is bench/gpu_overhead.py.

    python3 bench/limiter_launch.py [--launches 500000] [--rounds 5] [--baseline 68e8a26]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "region")]

from costtools import BASELINE, build_cost_tool, build_fake_with_events, build_shim_at, launch_cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=BASELINE)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fake = build_fake_with_events(tmp / "fake")
        tool = build_cost_tool(tmp, fake)
        builds = {args.baseline: build_shim_at(args.baseline, tmp), "this tree": build_shim_at(None, tmp)}
        rows = []
        for name, shim in builds.items():
            res = {}
            for label, env in (("no SM limit", {}), ("SM limit 50", {"CUDA_DEVICE_SM_LIMIT": "50"})):
                runs = [launch_cost(tool, shim, fake, tmp / f"c-{name}-{label}-{i}".replace(" ", "_"),
                                    args.launches, **env) for i in range(args.rounds)]
                res[label] = (statistics.median(r["ns_per_launch"] for r in runs),
                              statistics.median(r["extra_calls"] for r in runs))
            rows.append((name, res))
    print(f"{'build':<10} {'no limit ns':>12} {'SM50 ns':>9} {'SM50/none':>10} {'extra calls/launch':>19}")
    for name, res in rows:
        free, lim = res["no SM limit"], res["SM limit 50"]
        print(f"{name:<10} {free[0]:12.1f} {lim[0]:9.1f} {lim[0] / free[0]:9.2f}x {lim[1]:19.3f}")
    (_, old), (_, new) = rows
    print(f"extra driver calls per throttled launch: {old['SM limit 50'][1]:.2f} -> {new['SM limit 50'][1]:.2f}; "
          f"host ns added by the limiter: {old['SM limit 50'][0] - old['no SM limit'][0]:.0f} -> "
          f"{new['SM limit 50'][0] - new['no SM limit'][0]:.0f} (an H200 launch costs ~3155 ns)")


if __name__ == "__main__":
    main()
