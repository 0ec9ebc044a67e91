#!/usr/bin/env python3
"""Time `vgpu-patch check` on a ~1 MB library and compare what it finds with abidiff's findings.

Usage: python3 bench/check_vs_abidiff.py [--runs 20] [--keep DIR]

1. Builds a ~1 MB shim-shaped library (the 449 surface functions plus thousands of hidden helpers,
   unstripped) and times `check_file` in-process (median of --runs; target <= 0.1 s) and the CLI in a
   fresh process (interpreter start and imports included).
2. Builds the one-defect fixtures of tests/check/elfcheck_fixtures.py and runs both tools on each (good, variant)
   pair: check with --vendor good, abidiff good variant (Debian's abigail-tools; skipped if missing).
   Prints which problems each tool reports.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "check"))

import elfcheck_fixtures as libs

from vgpu_patch.elf.check import check_file

TARGET_S = 0.1
HELPERS = 5000  # hidden helpers: enough code for ~1 MB


def big_library(d: Path, missing: bool = False) -> Path:
    """The surface plus HELPERS hidden functions with real bodies (loops, a switch) -> ~1 MB .so."""
    src = d / "big.c"
    if not src.exists():
        body = []
        for i in range(HELPERS):
            body.append(
                f"__attribute__((visibility(\"hidden\"), noinline)) unsigned long h{i}(unsigned long x) {{\n"
                f"  unsigned long s = {i};\n  for (unsigned long k = 0; k < (x & 31); k++) {{\n"
                f"    switch ((s + k) % 5) {{ case 0: s ^= x * {i * 7 + 1}UL; break;\n"
                f"      case 1: s += k << {i % 13}; break;\n"
                f"      case 2: s = (s >> 3) | (x << 7); break; case 3: s *= {i | 1}UL; break; default: s -= x; }}\n"
                f"  }}\n  return s;\n}}\n"
            )
        body.extend(f"int {n}(void) {{ return (int)h{k % HELPERS}({k}); }}\n"
                    for k, n in enumerate(libs.surface_names()))
        src.write_text("".join(body))
        subprocess.run(["gcc", "-O1", "-fPIC", "-c", "big.c", "-o", "big.o"], cwd=d, check=True)
    names = [n for n in libs.surface_names() if not (missing and n == libs.PROBE)]
    vs = d / ("big-missing.map" if missing else "big.map")
    vs.write_text("{\n  global:\n" + "".join(f"    {n};\n" for n in names) + "  local: *;\n};\n")
    out = d / ("big-missing.so" if missing else "big.so")
    subprocess.run(["gcc", "-shared", "-o", out.name, "big.o", f"-Wl,--version-script={vs.name}",
                    "-Wl,-soname,libvgpu.so", "-Wl,--build-id=sha1", "-Wl,-z,noexecstack"], cwd=d, check=True)
    return out


def time_in_process(path: Path, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        check_file(path)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def time_cli(path: Path, runs: int) -> float:
    samples = []
    for _ in range(max(3, runs // 4)):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "check", str(path), "--json"], cwd=REPO,
                       capture_output=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def abidiff(a: Path, b: Path) -> tuple[int, str, float]:
    t = time.perf_counter()
    proc = subprocess.run(["abidiff", str(a), str(b)], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t


def abidiff_summary(code: int, text: str) -> str:
    """abidiff's exit bitmask: 1 error, 2 usage, 4 ABI change, 8 incompatible change."""
    if code & 3:
        return f"error ({code})"
    if not code & 12:
        return "nothing"
    finds = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.startswith(" ") and "summary" not in ln.lower()]
    what = finds[0].split(" not referenced")[0][:48] if finds else "ABI change"
    return f"exit {code}: {what}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--keep", type=Path, help="build in this directory and keep it")
    args = ap.parse_args()
    d = args.keep or Path(tempfile.mkdtemp(prefix="check-bench-"))
    d.mkdir(parents=True, exist_ok=True)
    have_abidiff = shutil.which("abidiff") is not None
    try:
        big, big_missing = big_library(d), big_library(d, missing=True)
        print(f"library: {big.stat().st_size / 1e6:.2f} MB, {HELPERS} "
              f"hidden helpers + {len(libs.surface_names())} exports, unstripped")
        check_file(big)  # warm imports and caches once
        fast = time_in_process(big, args.runs)
        slow = time_in_process(big_missing, args.runs)
        pair = statistics.median(_timed(lambda: check_file(big_missing, vendor=big)) for _ in range(args.runs))
        cold = time_cli(big, args.runs)
        print(f"check_file (all exported, median of {args.runs}): {fast * 1000:.1f} ms "
              f"= {fast / TARGET_S:.2f} x the {TARGET_S * 1000:.0f} ms target")
        print(f"check_file (1 name local -> reads .symtab):    {slow * 1000:.1f} ms "
              f"= {slow / TARGET_S:.2f} x target")
        print(f"check_file --vendor (both files parsed):        {pair * 1000:.1f} ms = {pair / TARGET_S:.2f} x target")
        print(f"vgpu-patch check --json, fresh process:         {cold * 1000:.1f} ms (interpreter + imports included)")
        if have_abidiff:
            t_abi = statistics.median(abidiff(big, big_missing)[2] for _ in range(5))
            print(f"abidiff on the same pair (median of 5):         {t_abi * 1000:.1f} ms "
                  f"= {t_abi / max(pair, 1e-9):.2f} x check_file --vendor")
        else:
            print("abidiff: not installed (apt-get install abigail-tools); comparison skipped")

        fx = libs.build_all(d / "fixtures")
        good = fx["good"]
        rows = []
        for name, (_, rule) in libs.VARIANTS.items():
            if rule is None:
                continue
            report = check_file(fx[name], vendor=good)
            hits = [f"{r.name}:{r.status}" for r in report.rules if r.status in ("fail", "warn")]
            abi = abidiff_summary(*abidiff(good, fx[name])[:2]) if have_abidiff else "skipped"
            rows.append((name, ", ".join(hits) or "nothing", abi))
        w0 = max(len(r[0]) for r in rows)
        w1 = max([len(r[1]) for r in rows] + [len("vgpu-patch check --vendor good")])
        print()
        print(f"{'problem':<{w0}}  {'vgpu-patch check --vendor good':<{w1}}  abidiff good variant")
        for name, hits, abi in rows:
            print(f"{name:<{w0}}  {hits:<{w1}}  {abi}")
        found_check = sum(1 for r in rows if r[1] != "nothing")
        found_abi = sum(1 for r in rows if r[2].startswith("exit"))
        print(f"\nfound: check {found_check}/{len(rows)}, abidiff {found_abi}/{len(rows)}")
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
