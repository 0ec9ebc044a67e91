#!/usr/bin/env python3
"""20 processes starting at once on one region file: time of each one's first cuMemAlloc (which
attaches the region), over the fake driver, beside the build before issue 11 (68e8a26) in one run.

Each process (bench/shim_cost.c attach, LD_PRELOAD=libvgpu.so) initialises CUDA, waits at a start
gate on stdin, then times its first allocation. Prints p50 / p90 / max in microseconds per build.

    python3 bench/region_attach.py [--procs 20] [--rounds 5] [--baseline 68e8a26]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "region")]

from costtools import BASELINE, attach_storm, build_cost_tool, build_fake_with_events, build_shim_at, pct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=BASELINE)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fake = build_fake_with_events(tmp / "fake")
        tool = build_cost_tool(tmp, fake)
        for name, shim in ((args.baseline, build_shim_at(args.baseline, tmp)), ("this tree", build_shim_at(None, tmp))):
            p50, p90, mx = [], [], []
            for i in range(args.rounds):
                t = attach_storm(tool, shim, fake, tmp / f"c-{name}-{i}".replace(" ", "_"), args.procs)
                p50.append(pct(t, 0.5))
                p90.append(pct(t, 0.9))
                mx.append(max(t))
            rows.append((name, statistics.median(p50), statistics.median(p90), statistics.median(mx)))
    print(f"first allocation of {args.procs} processes started at once (us, median of {args.rounds} rounds)")
    print(f"{'build':<10} {'p50':>9} {'p90':>9} {'max':>9}")
    for name, a, b, c in rows:
        print(f"{name:<10} {a:9.1f} {b:9.1f} {c:9.1f}")
    print(f"p90 ratio (this tree / {args.baseline}): {rows[1][2] / rows[0][2]:.3f}")


if __name__ == "__main__":
    main()
