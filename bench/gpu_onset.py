#!/usr/bin/env python3
"""How a limit behaves when work starts, on a real GPU (issue 34's cold start and IS-004), each row beside bare:

- cold: a process's first 100 decode steps, as GPU-Virt-Bench's LLM-004 runs them (no warm-up; a 32-block and a
  1-block kernel on a created stream, then its sync): the median step's latency, and that over bare's; from a
  fresh process, and after 200 every-SM kernels of about 550 us (prefill, or the benchmarks before it);
- onset: after 200 ms idle, steps of one every-SM kernel (about 100 us) and a sync: when the first throttled step
  ended (hold_ms; the issue asks for 20 ms or less), and the busy share of each 10 ms of the first 100.

Every row runs --rounds fresh processes (each its own region), alternating with a bare one; the median and the
spread (min-max) of the rounds. --before SRC builds a second shim from another c_src tree (an older checkout's)
and runs its rows beside ours, in the same run. `vgpu-patch bench` runs ours (vgpu_patch/gpubench/onset.py).

    python3 bench/gpu_onset.py [--rounds 5] [--before OLD/c_src] [--json OUT]
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

from vgpu_patch.gpubench.onset import PREFILL, cold, onset_rows, onset_run
from vgpu_patch.gpubench.program import Shim, build_region_gpu
from vgpu_patch.gpubench.stats import spread_text
from vgpu_patch.shim_build.build import build_shim

ROWS = onset_rows([50, 25])  # no limit, time 50, time 25, occupancy 50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", type=Path, help="another c_src tree, built and run beside ours")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    table: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build_region_gpu(tmp / "region_gpu")
        shims = {"ours": Shim(build_shim(tmp / "ours", compiler="gcc", glibc=None).library, tmp)}
        if args.before:
            lib = build_shim(tmp / "before", compiler="gcc", glibc=None, src_dir=args.before).library
            shims["before"] = Shim(lib, tmp)

        print("== cold: the first 100 decode steps (LLM-004), median step latency", flush=True)
        for who, shim, prefill, (name, extra) in [(w, s, p, r) for p in (0, PREFILL) for w, s in shims.items()
                                                  for r in ROWS]:
            if prefill == 0 or name != "no limit":
                got = cold(exe, partial(shim.env, extra), prefill, args.rounds, f"{who} {name}")
                table.append({"part": "cold", "shim": who, "row": name, **got.to_json()})
                after = "after prefill" if prefill else "fresh"
                print(f"  {who:<7} {name:<13} {after:<13} p50 {spread_text(got.p50_us, '.1f')} us, "
                      f"{spread_text(got.over_bare)} x bare's; first steps {got.first_us[0]}", flush=True)
        print("== onset: after 200 ms idle, when the first throttled step ended (ms), busy per 10 ms", flush=True)
        for who, shim in shims.items():
            for name, extra in ROWS[1:]:
                held = onset_run(exe, partial(shim.env, extra), args.rounds, f"{who} {name}")
                table.append({"part": "onset", "shim": who, "row": name, **held.to_json()})
                print(f"  {who:<7} {name:<13} hold {spread_text(held.hold_ms, '.1f')} ms; busy {held.busy_10ms[0]}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
