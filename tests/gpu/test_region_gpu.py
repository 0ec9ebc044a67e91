"""Shared region and SM limiter on a real GPU (run on the H200: `pytest tests/gpu --gpu -s`).

Prints the figures for docs/benchmarks.md:
  two processes sharing CUDA_DEVICE_MEMORY_LIMIT=4g through one region file;
  a compute-bound kernel loop bare, under the shim without SM limit, with CUDA_DEVICE_SM_LIMIT=100, 50, 25.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Gpu, kv, start_hold

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30
LOOP_SECONDS = "4"





def test_two_processes_share_a_4g_limit(gpu: Gpu, region_gpu: Path) -> None:
    env = gpu.env("4g")  # one region file (CUDA_DEVICE_MEMORY_SHARED_CACHE) for both processes
    a, ra = start_hold(region_gpu, env, 2 * 1024)
    try:
        b, rb = start_hold(region_gpu, env, 3 * 1024)
        try:
            show = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "region", "show", "--json",
                                   env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]], capture_output=True, text=True,
                                  cwd=ROOT, timeout=60)
            doc = json.loads(show.stdout)
        finally:
            b.communicate("\n", timeout=60)
    finally:
        a.communicate("\n", timeout=60)
    print(f"\nFIGURE two-process 4 GiB limit: A got {ra['allocated_mib']} MiB, B got {rb['allocated_mib']} MiB "
          f"(then rc={rb['last_rc']}), B sees total={int(rb['total']) // MiB} MiB free={int(rb['free']) // MiB} MiB; "
          f"region used={doc['devices'][0]['used'] // MiB} MiB uuid={doc['devices'][0]['uuid']}")
    assert int(ra["allocated_mib"]) == 2 * 1024
    # B gets what the two contexts (about 518 MiB each on an H200) and A's 2 GiB leave, in 512 MiB pieces
    assert 0 < int(rb["allocated_mib"]) <= 1024 and rb["last_rc"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert int(rb["total"]) == 4 * GiB and int(rb["free"]) < 512 * MiB
    used = doc["devices"][0]["used"]
    assert 4 * GiB - 512 * MiB < used <= 4 * GiB and doc["devices"][0]["uuid"].startswith("GPU-")
    assert len(doc["procs"]) == 2


def test_a_context_that_would_not_fit_is_refused_before_it_is_made(gpu: Gpu, region_gpu: Path) -> None:
    """A process that starts in a full container: what the container's first context took is charged before
    its own is made, so the driver never makes a context over the limit (about 518 MiB on an H200)."""
    env = gpu.env("2g")
    a, ra = start_hold(region_gpu, env, 1024)  # its context and 1 GiB: less than a context is left
    try:
        late = subprocess.run([str(region_gpu), "hold", "512"], env=env, input="\n", capture_output=True,
                              text=True, timeout=120)
    finally:
        a.communicate("\n", timeout=60)
    print(f"\nFIGURE a new process in a full 2 GiB container: {late.stdout.strip()!r}; {late.stderr.strip()!r}")
    assert int(ra["allocated_mib"]) == 1024 and int(ra["free"]) < 512 * MiB, ra
    assert "init=failed" in late.stdout, late.stdout
    assert "refused before the driver makes it" in late.stderr, late.stderr


def _loop_kv(gpu: Gpu, exe: Path, preload: bool, **extra: str) -> dict[str, str]:
    env = gpu.env(None, preload=preload, **extra)
    p = subprocess.run([str(exe), "loop", LOOP_SECONDS], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return kv(p.stdout)


def _loop(gpu: Gpu, exe: Path, preload: bool, **extra: str) -> float:
    return float(_loop_kv(gpu, exe, preload, **extra)["kernels_per_s"])


def test_sm_limit_scales_a_compute_bound_loop(gpu: Gpu, region_gpu: Path) -> None:
    bare = _loop(gpu, region_gpu, preload=False)
    shim = _loop(gpu, region_gpu, preload=True)
    full = _loop(gpu, region_gpu, preload=True, CUDA_DEVICE_SM_LIMIT="100")
    half = _loop(gpu, region_gpu, preload=True, CUDA_DEVICE_SM_LIMIT="50")
    quarter = _loop(gpu, region_gpu, preload=True, CUDA_DEVICE_SM_LIMIT="25")
    print(f"\nFIGURE compute-bound loop kernels/s: bare {bare:.1f}, shim {shim:.1f} ({shim / bare:.3f}x), "
          f"SM_LIMIT=100 {full:.1f} ({full / bare:.3f}x), SM_LIMIT=50 {half:.1f} ({half / bare:.3f}x), "
          f"SM_LIMIT=25 {quarter:.1f} ({quarter / bare:.3f}x)")
    assert full / bare > 0.95  # 100 = no limit: unchanged (within run-to-run clock noise)
    assert 0.40 < half / bare < 0.60  # 50 halves it
    assert 0.18 < quarter / bare < 0.35



def test_an_occupancy_charge_makes_the_limit_a_share_of_the_sms(gpu: Gpu, region_gpu: Path) -> None:
    """VGPU_SM_CHARGE=occupancy on the real driver: a grid of one wave that fills every SM is charged its time
    (SM 50: half of bare), one that fills a quarter of them is charged a quarter of it (SM 50: full speed;
    SM 10: 0.4 of bare). The driver's occupancy API says how many of the loop's blocks one SM holds."""
    probe = _loop_kv(gpu, region_gpu, preload=False)
    whole = int(probe["sms"]) * int(probe["per_sm"])
    assert whole > 0, probe
    figures = {}
    for name, blocks, limit in [("whole", whole, "50"), ("quarter", whole // 4, "50"), ("quarter", whole // 4, "10")]:
        bare = _loop(gpu, region_gpu, preload=False, SPIN_BLOCKS=str(blocks))
        ours = _loop(gpu, region_gpu, preload=True, SPIN_BLOCKS=str(blocks), CUDA_DEVICE_SM_LIMIT=limit,
                     VGPU_SM_CHARGE="occupancy")
        figures[f"{name} at {limit}"] = ours / bare
    timed = _loop(gpu, region_gpu, preload=True, SPIN_BLOCKS=str(whole // 4), CUDA_DEVICE_SM_LIMIT="50")
    figures["quarter at 50, time charge"] = timed / _loop(gpu, region_gpu, preload=False, SPIN_BLOCKS=str(whole // 4))
    print(f"\nFIGURE occupancy charge ({probe['sms']} SMs x {probe['per_sm']} blocks of 256): "
          + ", ".join(f"{k} {v:.3f}x" for k, v in figures.items()))
    assert 0.42 < figures["whole at 50"] < 0.58, figures
    assert figures["quarter at 50"] > 0.90, figures
    assert 0.34 < figures["quarter at 10"] < 0.46, figures
    assert 0.42 < figures["quarter at 50, time charge"] < 0.58, figures

