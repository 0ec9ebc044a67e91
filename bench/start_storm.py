#!/usr/bin/env python3
"""1, 16 and 64 processes starting at once on one region (a torchrun's workers), over the fake driver: the
slowest one's start (exec, cuInit, context, the region attached by its first cuMemAlloc), median and spread
(min - max) over the rounds, and how many processes warned of a lock timeout (HAMi PR #155: one global file
lock, 8+ processes starting together timed out at 10 s+).

    python3 bench/start_storm.py [--procs 1,16,64] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "region")]

from costtools import build_cost_tool, build_fake_with_events, build_shim_at, start_storm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    counts = [int(n) for n in args.procs.split(",")]
    print(f"slowest start of N processes started at once on one region (ms, {args.rounds} rounds)")
    print(f"{'N':>4} {'median':>9} {'min':>9} {'max':>9} {'lock warnings':>14}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fake = build_fake_with_events(tmp / "fake")
        tool = build_cost_tool(tmp, fake)
        shim = build_shim_at(None, tmp)
        for n in counts:
            slowest, warned = [], 0
            for i in range(args.rounds):
                times, errs = start_storm(tool, shim, fake, tmp / f"c-{n}-{i}", n)
                slowest.append(times[-1] * 1000)
                warned += sum("region lock not obtained" in e for e in errs)
            print(f"{n:>4} {statistics.median(slowest):9.1f} {min(slowest):9.1f} {max(slowest):9.1f} {warned:>14}")


if __name__ == "__main__":
    main()
