#!/usr/bin/env python3
"""How a real GPU takes turns between busy contexts: each process of a row runs
vgpu_patch/gpubench/region_gpu.c's loop with LOOP_TRACE, which records every kernel's start and end on the
GPU's global timer (one clock for every context), and this script reads the merged timeline:

- turns: runs of consecutive kernels of one process, how long each lasts, and the gap at each change of
  process (the GPU's switch between contexts, nobody's work);
- per process: its share of the window's GPU time, and how long the first kernel of a batch (the loop
  syncs every 8) waited between its launch and its start.

    python3 bench/gpu_turns.py [--seconds 2] [--rows TEXT] [--keep DIR]

Each row prints its shares (kernels/s over one bare process alone, as bench/sm_share.py does) beside the
timeline's figures, as medians with the 10th-90th percentiles."""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vgpu_patch.gpubench.program import LONG_ITERS, SHORT_ITERS, build_region_gpu
from vgpu_patch.gpubench.shares import Container, ShareRunner
from vgpu_patch.shim_build.build import build_shim

C = Container
ROWS: list[tuple[str, int, bool, list[Container]]] = [
    ("short, bare alone", SHORT_ITERS, False, [C(None)]),
    ("short, bare pair", SHORT_ITERS, False, [C(None), C(None)]),
    ("short, shim 30 / 70", SHORT_ITERS, True, [C(30), C(70)]),
    ("short, shim 50 / 50", SHORT_ITERS, True, [C(50), C(50)]),
    ("short, shim 30 alone", SHORT_ITERS, True, [C(30)]),
    ("long, bare pair", LONG_ITERS, False, [C(None), C(None)]),
    ("long, shim 30 / 70", LONG_ITERS, True, [C(30), C(70)]),
]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def spread(xs: list[float], scale: float = 1e-3) -> str:
    """median (p10-p90), in microseconds by default"""
    if not xs:
        return "-"
    return f"{statistics.median(xs) * scale:.1f} ({pct(xs, 0.1) * scale:.1f}-{pct(xs, 0.9) * scale:.1f})"


def load(path: Path) -> list[tuple[int, int, int]]:
    """(launch, start, end) a kernel, all on the GPU's timer"""
    lines = path.read_text().split("\n")
    off = int(lines[0])
    out = []
    for line in lines[1:]:
        if line:
            a, s, e = (int(x) for x in line.split())
            out.append((a + off, s, e))
    return out


def analyse(traces: dict[str, list[tuple[int, int, int]]]) -> dict[str, object]:
    lo = max(t[0][1] for t in traces.values()) + 300_000_000  # every process running for 0.3 s
    hi = min(t[-1][2] for t in traces.values()) - 100_000_000
    span = hi - lo
    merged = sorted((s, e, name) for name, t in traces.items() for (_, s, e) in t if lo <= s and e <= hi)
    turns: list[tuple[str, int, int, int]] = []  # (who, first start, last end, kernels)
    gaps: list[float] = []
    overlap = 0
    for s, e, who in merged:
        if turns and turns[-1][0] == who:
            w, s0, e0, n = turns[-1]
            turns[-1] = (w, s0, max(e0, e), n + 1)
            continue
        if turns:
            gaps.append(s - turns[-1][2])
            overlap += max(0, turns[-1][2] - s)
        turns.append((who, s, e, 1))
    out: dict[str, object] = {"window_ms": span / 1e6}
    if len(traces) > 1:
        out["turn_us"] = spread([float(e - s) for _, s, e, _ in turns])
        out["turn_kernels"] = spread([float(n) for *_, n in turns], 1)
        out["switch_gap_us"] = spread(gaps)
        out["switches_per_ms"] = f"{len(gaps) / (span / 1e6):.2f}"
        out["switch_time_share"] = f"{sum(g for g in gaps if g > 0) / span:.3f}"
        out["overlap_share"] = f"{overlap / span:.3f}"
    for name, t in traces.items():
        inside = [(a, s, e) for (a, s, e) in t if lo <= s and e <= hi]
        firsts = [s - a for i, (a, s, e) in enumerate(t) if i % 8 == 0 and lo <= s and e <= hi]
        gpu = sum(e - s for _, s, e in inside)
        out[name] = (f"gpu {gpu / span:.3f} of the window, kernel {spread([float(e - s) for _, s, e in inside])} us, "
                     f"batch wait {spread([float(x) for x in firsts])} us, {len(inside)} kernels")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rows", default="", help="only the rows whose name has this text")
    ap.add_argument("--keep", type=Path, help="copy each row's traces into this directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build_region_gpu(tmp / "region_gpu")
        shim = build_shim(tmp / "shim", compiler="gcc", glibc=None).library
        runner = ShareRunner(exe, shim, tmp, args.seconds)
        for name, iters, with_shim, cs in ROWS:
            if args.rows not in name:
                continue
            tdir = tmp / "trace"
            shutil.rmtree(tdir, ignore_errors=True)
            tdir.mkdir()
            shares = runner.run(cs, iters, shim=with_shim, trace=tdir)
            traces = {f.stem: load(f) for f in sorted(tdir.glob("*.txt"))}
            print(f"== {name}: shares " + " / ".join(f"{s:.3f}" for s in shares), flush=True)
            for k, v in analyse(traces).items():
                print(f"   {k}: {v}", flush=True)
            if args.keep:
                dest = args.keep / name.replace(",", "").replace(" / ", "-").replace(" ", "_")
                shutil.copytree(tdir, dest, dirs_exist_ok=True)


if __name__ == "__main__":
    main()
