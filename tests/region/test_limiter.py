"""The SM limiter's algorithm over a simulated GPU (c_src/tests/limiter/limiter_sim.c): the same
limiter.c the shim links, with the driver's event calls answered by a one-stream GPU model.
Wall-clock based, so the bounds are wide; bench/region_sm_limit.py prints the exact ratios."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vgpu_patch.build import header_dir

from regiontools import C_SRC, CFLAGS, REGION_SOURCES, cc

KERNEL_US, COUNT = 1000, 200  # 200 ms of GPU work per run


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("limiter-sim") / "limiter_sim"
    srcs = [C_SRC / "tests" / "limiter" / "limiter_sim.c", C_SRC / "limiter" / "limiter.c", *REGION_SOURCES]
    subprocess.run([cc(), *CFLAGS, f"-I{header_dir()}", *map(str, srcs), "-o", str(out), "-lpthread"], check=True)
    return out


def run_sim(sim: Path, mode: str, **env: str) -> tuple[int, float]:
    """(enabled, throughput as a fraction of the GPU work's own duration)"""
    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("CUDA_", "GPU_CORE"))}
    cp = subprocess.run([str(sim), mode, str(KERNEL_US), str(COUNT)], env={**base, **env}, capture_output=True,
                        text=True, timeout=60, check=True)
    kv = dict(item.split("=") for item in cp.stdout.split())
    return int(kv["enabled"]), float(kv["gpu_ms"]) / float(kv["wall_ms"])


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_half_limit_halves_a_compute_bound_loop(sim: Path, mode: str) -> None:
    enabled, full = run_sim(sim, mode)
    assert enabled == 0 and full > 0.8
    enabled, half = run_sim(sim, mode, CUDA_DEVICE_SM_LIMIT="50")
    assert enabled == 1
    # 50% of the device's time, plus the 20 ms burst the bucket starts with (10% of a 200 ms run)
    assert 0.38 < half / full < 0.66, (half, full)


def test_quarter_limit(sim: Path) -> None:
    _, full = run_sim(sim, "async")
    _, quarter = run_sim(sim, "async", CUDA_DEVICE_SM_LIMIT_0="25")
    assert 0.18 < quarter / full < 0.40, (quarter, full)


@pytest.mark.parametrize("env", [{}, {"CUDA_DEVICE_SM_LIMIT": "100"}, {"CUDA_DEVICE_SM_LIMIT": "0"},
                                 {"CUDA_DEVICE_SM_LIMIT": "150"},
                                 {"CUDA_DEVICE_SM_LIMIT": "50", "GPU_CORE_UTILIZATION_POLICY": "disable"},
                                 {"CUDA_DEVICE_SM_LIMIT_1": "50"}])
def test_no_limit_means_disabled(sim: Path, env: dict) -> None:
    """Disabled = the launch wrappers' one branch is never taken: no thread, no event, no cost."""
    enabled, ratio = run_sim(sim, "async", **env)
    assert enabled == 0 or env == {"CUDA_DEVICE_SM_LIMIT_1": "50"}
    assert ratio > 0.8  # device 0 is never throttled by device 1's limit


def test_light_user_is_not_throttled(sim: Path) -> None:
    """20% duty (1 ms kernel, 4 ms on the CPU): under a 50% limit, untouched; idle time is never charged."""
    _, free = run_sim(sim, "sparse")
    _, limited = run_sim(sim, "sparse", CUDA_DEVICE_SM_LIMIT="50")
    assert limited / free > 0.85, (limited, free)


def test_force_policy_ignores_the_monitor_switch(sim: Path) -> None:
    _, full = run_sim(sim, "async")
    _, forced = run_sim(sim, "async", CUDA_DEVICE_SM_LIMIT="50", GPU_CORE_UTILIZATION_POLICY="force")
    assert forced / full < 0.66
