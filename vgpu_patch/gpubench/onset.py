"""How a limit behaves when work starts (issue 34's cold start and IS-004), each beside bare:

- cold: a process's first 100 decode steps, as GPU-Virt-Bench's LLM-004 runs them (no warm-up; a 32-block and a
  1-block kernel on a created stream, then its sync): the median step's latency over bare's; from a fresh process,
  and after 200 every-SM kernels of about 550 us (prefill, or the benchmarks before it);
- onset: after 200 ms idle, steps of one every-SM kernel (about 100 us) and a sync: when the first throttled step
  ended (hold_ms; the issue asks for 20 ms or less), and the busy share of each 10 ms of the first 100.

Every run is a fresh process with a region of its own (a container that just started)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .program import clean_env, run
from .stats import Spread
from .steps import Row

COLD_STEPS = 100
PREFILL = 200  # every-SM kernels before the decode steps, in the "after prefill" rows
ONSET_SECONDS = 0.3


def onset_rows(limits: list[int]) -> list[Row]:
    """No limit (cold start only: the shim's own cost), the time charge at each limit, the occupancy charge at the
    first"""
    return ([("no limit", {})] + [(f"time {lim}", {"CUDA_DEVICE_SM_LIMIT": str(lim)}) for lim in limits]
            + [(f"occupancy {limits[0]}", {"CUDA_DEVICE_SM_LIMIT": str(limits[0]), "VGPU_SM_CHARGE": "occupancy"})])


@dataclass
class Cold:
    prefill: int
    p50_us: list[float]  # a round each
    over_bare: list[float]
    first_us: list[str]  # the first ten steps' latencies, comma-separated, as region_gpu prints them

    def to_json(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "p50_us": self.p50_us, "over_bare": self.over_bare,
                "over_bare_median": Spread.of(self.over_bare).to_json(), "first_us": self.first_us}


@dataclass
class Onset:
    hold_ms: list[float]  # a round each; -1: no step was throttled
    busy_10ms: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"hold_ms": self.hold_ms, "hold_ms_median": Spread.of(self.hold_ms).to_json(),
                "busy_10ms": self.busy_10ms}


def cold(exe: Path, env: Callable[[], dict[str, str]], prefill: int, rounds: int, what: str) -> Cold:
    """`rounds` fresh processes under `env()`, each after a bare one"""
    p50s, ratios, firsts = [], [], []
    for r in range(max(1, rounds)):
        steps = str(COLD_STEPS)
        bare = run(exe, "cold", steps, clean_env({"COLD_PREFILL": str(prefill)}), f"{what}, round {r + 1} (bare)")
        got = run(exe, "cold", steps, clean_env({**env(), "COLD_PREFILL": str(prefill)}), f"{what}, round {r + 1}")
        p50s.append(float(got["cold_p50_us"]))
        ratios.append(float(got["cold_p50_us"]) / float(bare["cold_p50_us"]))
        firsts.append(got["cold_first_us"])
    return Cold(prefill, p50s, ratios, firsts)


def onset_run(exe: Path, env: Callable[[], dict[str, str]], rounds: int, what: str) -> Onset:
    """`rounds` fresh processes under `env()`: when each one's limit took hold"""
    holds, busy = [], []
    for r in range(max(1, rounds)):
        got = run(exe, "onset", f"{ONSET_SECONDS:g}", clean_env(env()), f"{what}, round {r + 1}")
        holds.append(float(got["hold_ms"]))
        busy.append(got["busy_10ms"])
    return Onset(holds, busy)
