#!/usr/bin/env python3
"""Cost of the shared-region budget, per cuMemAlloc+cuMemFree pair, on this machine (no GPU needed).

Times vgpu_region_reserve+release (c_src/region through c_src/tests/region/region_tool.c):
  - no limit:   an atomic add/subtract on our slot (no lock);
  - with limit: flock + sum over live slots + add, then a lock-free subtract;
  - with limit, 1 / 20 / 200 live peer slots to sum over;
  - with limit, 2 processes allocating at once (lock contention);
against the process-local CAS counter the shim falls back to. Prints ns per pair and ratios.

    python3 bench/region_reserve.py [--pairs 200000]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "region"))

from regiontools import C_SRC, CFLAGS, REGION_SOURCES


def build(tmp: Path) -> Path:
    out = tmp / "region_tool"
    subprocess.run([shutil.which("gcc") or "cc", *CFLAGS, str(C_SRC / "tests" / "region" / "region_tool.c"),
                    *map(str, REGION_SOURCES), "-o", str(out), "-lpthread"], check=True)
    return out


def ns(out: str, key: str) -> float:
    line = next(ln for ln in out.splitlines() if ln.startswith(key + " "))
    return float(line.split("ns=")[1].split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=200_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tool = build(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}

        def run(*steps: str, limit: str | None = "100g", cache: str = "c") -> str:
            env = {**base, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / cache)}
            if limit:
                env["CUDA_DEVICE_MEMORY_LIMIT"] = limit
            return subprocess.run([str(tool), *steps], env=env, capture_output=True, text=True, check=True).stdout

        n = args.pairs
        cas = ns(run(f"benchcas:{n}:4096"), "benchcas")
        rows = [("process-local CAS (fallback)", cas)]
        rows.append(("region, no limit", ns(run("attach", f"bench:{n}:4096", limit=None, cache="nolimit"), "bench")))
        rows.append(("region, limit, alone", ns(run("attach", f"bench:{n}:4096", cache="alone"), "bench")))
        for peers in (20, 200):
            cache = f"peers{peers}"
            held = [subprocess.Popen([str(tool), "attach", "reserve:0:4096", "wait"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**base, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / cache),
                                          "CUDA_DEVICE_MEMORY_LIMIT": "100g"}) for _ in range(peers)]
            for p in held:
                p.stdout.readline()
                p.stdout.readline()
            timing = ns(run("attach", f"bench:{n}:4096", cache=cache), "bench")
            rows.append((f"region, limit, {peers} live peers", timing))
            for p in held:
                p.communicate("\n")
        env = {**base, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp / "contended"), "CUDA_DEVICE_MEMORY_LIMIT": "100g"}
        both = [subprocess.Popen([str(tool), "attach", f"bench:{n}:4096"], env=env, stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
        outs = [p.communicate()[0] for p in both]
        rows.append(("region, limit, 2 processes at once", max(ns(o, "bench") for o in outs)))
    width = max(len(r[0]) for r in rows)
    print(f"{'reserve+release pair':<{width}}  {'ns':>9}  {'vs CAS':>7}")
    for name, v in rows:
        print(f"{name:<{width}}  {v:9.1f}  {v / cas:6.1f}x")


if __name__ == "__main__":
    main()
