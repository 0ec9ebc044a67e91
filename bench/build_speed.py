#!/usr/bin/env python3
"""How long `vgpu-patch build` takes: zig cold (fresh cache: builds its libc), zig warm, host gcc.

Builds the real c_src (or --src DIR) side by side in one run and prints seconds and ratios to the
gcc build. Also checks that every zig variant gives the same sha256 cold and warm.

    python3 bench/build_speed.py [--src c_src] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vgpu_patch.shim_build.build import SRC_DIR, build_shim


def timed(out: Path, **kw) -> tuple[float, str]:
    t = time.perf_counter()
    r = build_shim(out, **kw)
    return time.perf_counter() - t, r.sha256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=SRC_DIR)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vgpu-bench-build-"))
    try:
        rows = []
        gcc_warm = None
        if shutil.which("gcc"):
            runs = [timed(work / f"gcc{i}", glibc=None, compiler="gcc", src_dir=args.src)[0]
                    for i in range(args.repeat)]
            gcc_warm = statistics.median(runs)
            rows.append(("gcc (host glibc, no floor)", None, gcc_warm))
        for arch, glibc in [("x86_64", "2.28"), ("x86_64", "2.17"), ("aarch64", "2.28")]:
            os.environ["VGPU_PATCH_ZIG_CACHE"] = str(work / f"zig-cache-{arch}-{glibc}")
            zig = {"arch": arch, "glibc": glibc, "compiler": "zig", "src_dir": args.src}
            cold, sha_cold = timed(work / f"cold-{arch}-{glibc}", **zig)
            warm_runs = []
            for i in range(args.repeat):
                t, sha = timed(work / f"warm-{arch}-{glibc}-{i}", **zig)
                assert sha == sha_cold, f"{arch} {glibc}: warm build differs from cold build"
                warm_runs.append(t)
            rows.append((f"zig {arch} glibc {glibc}", cold, statistics.median(warm_runs)))
        print(f"source: {args.src}   cpus: {os.cpu_count()}   repeat: {args.repeat} (median)")
        print(f"{'variant':32} {'cold s':>8} {'warm s':>8} {'warm/gcc':>9}")
        for name, cold, warm in rows:
            ratio = f"{warm / gcc_warm:9.2f}" if gcc_warm else f"{'n/a':>9}"
            print(f"{name:32} {cold if cold is not None else float('nan'):8.2f} {warm:8.2f} {ratio}")
        print("every zig variant: cold and warm builds have the same sha256")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
