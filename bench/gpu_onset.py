#!/usr/bin/env python3
"""How a limit behaves when work starts, on a real GPU (issue 34's cold start and IS-004), each row beside bare:

- cold: a process's first 100 decode steps, as GPU-Virt-Bench's LLM-004 runs them (no warm-up; a 32-block and a
  1-block kernel on a created stream, then its sync): the median step's latency, and that over bare's; from a
  fresh process, and after 200 every-SM kernels of about 550 us (prefill, or the benchmarks before it);
- onset: after 200 ms idle, steps of one every-SM kernel (about 100 us) and a sync: when the first throttled step
  ended (hold_ms; the issue asks for 20 ms or less), and the busy share of each 10 ms of the first 100.

Every row runs --rounds fresh processes (each its own region), alternating with a bare one; the median and the
spread (min-max) of the rounds. --before SRC builds a second shim from another c_src tree (an older checkout's)
and runs its rows beside ours, in the same run.

    python3 bench/gpu_onset.py [--rounds 5] [--before OLD/c_src] [--json OUT]
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

from shares import build_region_gpu

from vgpu_patch.shim_build.build import build_shim

ROWS = [("no limit", {}), ("time 50", {"CUDA_DEVICE_SM_LIMIT": "50"}), ("time 25", {"CUDA_DEVICE_SM_LIMIT": "25"}),
        ("occupancy 50", {"CUDA_DEVICE_SM_LIMIT": "50", "VGPU_SM_CHARGE": "occupancy"})]


def once(exe: Path, mode: str, arg: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_DEVICE_", "CUDA_MPS_", "GPU_CORE", "LD_PRELOAD", "VGPU_", "SPIN_"))}
    env.update(NCCL_NVLS_ENABLE="0", **extra)
    p = subprocess.run([str(exe), mode, arg], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)


def spread(xs: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


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
        shims = {"ours": build_shim(tmp / "ours", compiler="gcc", glibc=None).library}
        if args.before:
            shims["before"] = build_shim(tmp / "before", compiler="gcc", glibc=None, src_dir=args.before).library
        node = tmp / "node"
        node.mkdir()
        n = 0

        def shim_env(shim: Path, extra: dict[str, str]) -> dict[str, str]:
            nonlocal n
            n += 1  # a fresh region each process: a container that just started
            return {"LD_PRELOAD": str(shim), "VGPU_NODE_DIR": str(node),
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / f"{n}.cache"), **extra}

        print("== cold: the first 100 decode steps (LLM-004), median step latency", flush=True)
        for who, shim, prefill, (name, extra) in [(w, s, p, r) for p in ("0", "200") for w, s in shims.items()
                                                  for r in ROWS]:
            if prefill == "0" or name != "no limit":
                ratios, p50s, firsts = [], [], []
                for _ in range(max(1, args.rounds)):
                    bare = once(exe, "cold", "100", {"COLD_PREFILL": prefill})
                    got = once(exe, "cold", "100", shim_env(shim, {**extra, "COLD_PREFILL": prefill}))
                    p50s.append(float(got["cold_p50_us"]))
                    ratios.append(float(got["cold_p50_us"]) / float(bare["cold_p50_us"]))
                    firsts.append(got["cold_first_us"])
                table.append({"part": "cold", "shim": who, "row": name, "prefill": int(prefill), "p50_us": p50s,
                              "over_bare": ratios, "first_us": firsts})
                after = "after prefill" if prefill != "0" else "fresh"
                print(f"  {who:<7} {name:<13} {after:<13} p50 {spread(p50s, '.1f')} us, {spread(ratios)} x bare's; "
                      f"first steps {firsts[0]}", flush=True)
        print("== onset: after 200 ms idle, when the first throttled step ended (ms), busy per 10 ms", flush=True)
        for who, shim in shims.items():
            for name, extra in ROWS[1:]:
                holds, busy = [], []
                for _ in range(max(1, args.rounds)):
                    got = once(exe, "onset", "0.3", shim_env(shim, extra))
                    holds.append(float(got["hold_ms"]))
                    busy.append(got["busy_10ms"])
                table.append({"part": "onset", "shim": who, "row": name, "hold_ms": holds, "busy_10ms": busy})
                print(f"  {who:<7} {name:<13} hold {spread(holds, '.1f')} ms; busy {busy[0]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
