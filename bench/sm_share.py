#!/usr/bin/env python3
"""Compute shares on a real GPU, side by side: the shim's SM limits (one budget per container, each
container its own region) beside bare time-slicing and MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), for
a long-kernel (about 2.2 ms) and a short-kernel (about 29 us) compute-bound loop, or PyTorch matmuls (about
60 us, bench/matmul_loop.py). Each figure is a container's kernels per second over one bare process alone.
`vgpu-patch bench` runs a few of these rows (long kernels) with the same runner, vgpu_patch/gpubench/shares.py.

    python3 bench/sm_share.py [--seconds 3] [--no-mps] [--kernels long|short|both|matmul] [--json OUT]
    python3 bench/sm_share.py --arrivals [--runs 5] ...   containers that start apart (ARRIVALS), each row
                                                          run N times: the median and the spread of every
                                                          container, the bare rows of the same run beside
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATMUL_N = 1024  # bench/matmul_loop.py's matrices: about 60 us a float32 matmul on an H200
MATMUL_ROWS = {"one process, 50", "two containers 50 / 50", "two containers 30 / 70",
               "bare pair (time-slicing ceiling)"}
sys.path.insert(0, str(ROOT))

from vgpu_patch.gpubench.mps import mps_daemon
from vgpu_patch.gpubench.program import LONG_ITERS, SHORT_ITERS, build_region_gpu
from vgpu_patch.gpubench.shares import Container, ShareRunner, jain
from vgpu_patch.gpubench.stats import spread_text
from vgpu_patch.shim_build.build import build_shim

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
    ("priority 0 beside priority 1, no limits", [C(None, env={"CUDA_TASK_PRIORITY": "0"}),
                                                 C(None, env={"CUDA_TASK_PRIORITY": "1"})]),
]
BARE = [("bare pair (time-slicing ceiling)", [C(None), C(None)]),
        ("bare trio", [C(None), C(None), C(None)])]
MPS = [("MPS 50 / 50", [C(50), C(50)]), ("MPS 30 / 70", [C(30), C(70)]),
       ("MPS 30 / 30 / 30", [C(30), C(30), C(30)])]
# a tenant that arrives while another is busy: measured over one window a second after the last arrival
ARRIVALS: list[tuple[str, list[Container]]] = [
    ("10 / 90 together", [C(10), C(90)]),
    ("10 first, 90 1 s later", [C(10), C(90, arrives=1.0)]),
    ("90 first, 10 1 s later", [C(90), C(10, arrives=1.0)]),
    ("30 first, 70 0.3 s later", [C(30), C(70, arrives=0.3)]),
    ("70 first, 30 0.3 s later", [C(70), C(30, arrives=0.3)]),
    ("70 first, 30 2 s later", [C(70), C(30, arrives=2.0)]),
    ("20 / 30 / 50, 0.3 s apart", [C(20), C(30, arrives=0.3), C(50, arrives=0.6)]),
    ("50 / 30 / 20, 0.3 s apart", [C(50), C(30, arrives=0.3), C(20, arrives=0.6)]),
    ("50 first, unlimited 1 s later", [C(50), C(None, arrives=1.0)]),
    ("unlimited first, 50 1 s later", [C(None), C(50, arrives=1.0)]),
]
MPS_ARRIVALS = [("MPS 10 / 90", [C(10), C(90)]), ("MPS 30 / 70", [C(30), C(70)]),
                ("MPS 20 / 30 / 50", [C(20), C(30), C(50)])]


def spread(runs: list[list[float]]) -> str:
    """each container's median over the runs and its spread (min-max)"""
    return " / ".join(spread_text(list(c)) for c in zip(*runs))


def arrivals(runner: ShareRunner, iters: int, size: str, runs: int, mps: bool, tmp: Path, table: list,
             only: str) -> None:
    bare = BARE[:1] if only else BARE
    rows = [(n, c, "shim") for n, c in ARRIVALS if only in n] + [(n, c, "bare") for n, c in bare]
    for name, cs, how in rows:
        got = [runner.run(cs, iters, shim=how == "shim") for _ in range(runs)]
        table.append({"kernels": size, "row": name, "runs": got})
        print(f"  {name:<32} {spread(got)}", flush=True)
    if mps:
        with mps_daemon(tmp):
            for name, cs in [r for r in MPS_ARRIVALS if only in r[0]]:
                got = [runner.run(cs, iters, shim=False, mps=True) for _ in range(runs)]
                table.append({"kernels": size, "row": name, "runs": got})
                print(f"  {name:<32} {spread(got)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-mps", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kernels", choices=["long", "short", "both", "matmul"], default="both")
    ap.add_argument("--arrivals", action="store_true", help="the staggered-arrival rows instead")
    ap.add_argument("--runs", type=int, default=5, help="runs of each --arrivals row")
    ap.add_argument("--rows", default="", help="only the --arrivals rows whose name has this text")
    ap.add_argument("--lead", type=float, default=2.5,
                    help="seconds from starting a row's processes to their loops' start (each needs its context)")
    args = ap.parse_args()
    table = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build_region_gpu(tmp / "region_gpu")
        shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        if args.kernels == "matmul":  # a PyTorch process takes longer to have its context
            runner = ShareRunner(ROOT / "bench" / "matmul_loop.py", shim, tmp, args.seconds, lead=10.0)
            sizes = [(MATMUL_N, "matmul")]
        else:
            runner = ShareRunner(exe, shim, tmp, args.seconds, lead=args.lead)
            sizes = [(i, s) for i, s in ((LONG_ITERS, "long"), (SHORT_ITERS, "short")) if args.kernels in (s, "both")]
        for iters, size in sizes:
            print(f"== {size} kernels (SPIN_ITERS={iters}): bare {runner.bare(iters):.1f} kernels/s", flush=True)
            if args.arrivals:
                arrivals(runner, iters, size, args.runs, not args.no_mps, tmp, table, args.rows)
                continue
            rows = [(n, c, "shim") for n, c in ROWS] + [(n, c, "bare") for n, c in BARE]
            if size == "matmul":  # a PyTorch process is slow to start: the rows the figures name
                rows = [r for r in rows if r[0] in MATMUL_ROWS]
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
