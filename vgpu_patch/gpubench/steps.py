"""Decode-like steps (issue 34's table): one kernel, then cuStreamSynchronize, in a loop; a process's steps per
second under the shim's SM charges or MPS over the same loop bare, and each step's latency (p50, p99)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .program import clean_env, run
from .stats import Spread


@dataclass(frozen=True)
class Shape:
    name: str
    blocks: int  # blocks of 256 threads; 0: four an SM, on every SM
    iters: int  # SPIN_ITERS: the length of each thread's FMA chain


# about 9 us, 21 us and 550 us steps on an H200: 32 blocks (a quarter of its 132 SMs), and every SM
SHAPES = [Shape("32 blocks, short step", 32, 500), Shape("32 blocks, longer step", 32, 1900),
          Shape("every SM, long step", 0, 65000)]

Row = tuple[str, dict[str, str]]  # a row's name and what it adds to a process's environment


def charge_rows(limits: list[int]) -> list[Row]:
    """The shim's rows: the time charge (the default, HAMi's meaning) at each limit, then the occupancy charge"""
    return ([(f"ours time {lim}", {"CUDA_DEVICE_SM_LIMIT": str(lim)}) for lim in limits]
            + [(f"ours occupancy {lim}", {"CUDA_DEVICE_SM_LIMIT": str(lim), "VGPU_SM_CHARGE": "occupancy"})
               for lim in limits])


def mps_rows(limits: list[int]) -> list[Row]:
    return [(f"MPS {lim} %", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(lim)}) for lim in limits]


def steps(exe: Path, seconds: float, shape: Shape, extra: dict[str, str], what: str) -> dict[str, float]:
    """One process's step loop: steps_per_s, p50_us, p99_us, max_us"""
    env = clean_env({"SPIN_ITERS": str(shape.iters), **({"SPIN_BLOCKS": str(shape.blocks)} if shape.blocks else {}),
                     **extra})
    kv = run(exe, "steps", f"{seconds:g}", env, what, timeout=120 + 2 * seconds)
    return {k: float(v) for k, v in kv.items()}


@dataclass
class StepsRow:
    shape: Shape
    row: str
    rounds: list[dict[str, float]]  # each: ratio, steps_per_s, p50_us, p99_us and the bare run's beside

    @property
    def ratio(self) -> Spread:
        return Spread.of([r["ratio"] for r in self.rounds])

    def median(self, key: str) -> float:
        return Spread.of([r[key] for r in self.rounds]).median

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape.name, "spin_blocks": self.shape.blocks, "spin_iters": self.shape.iters,
                "row": self.row, "ratio": self.ratio.median, "min": self.ratio.min, "max": self.ratio.max,
                "p50_us": self.median("p50_us"), "p99_us": self.median("p99_us"),
                "bare_p50_us": self.median("bare_p50_us"), "rounds": self.rounds}


def measure_steps(exe: Path, seconds: float, shape: Shape, row: str, env: Callable[[], dict[str, str]],
                  rounds: int) -> StepsRow:
    """`rounds` runs of the row, each after a bare run (no shim, no MPS): a ratio per round, over the bare run
    just before it, so a GPU whose clocks drift over the bench compares like with like"""
    out = []
    for r in range(max(1, rounds)):
        what = f"{shape.name}, {row}, round {r + 1}"
        bare = steps(exe, seconds, shape, {}, f"{what} (bare)")  # without MPS too: a client needs its pipe
        got = steps(exe, seconds, shape, env(), what)
        out.append({"ratio": got["steps_per_s"] / bare["steps_per_s"], "steps_per_s": got["steps_per_s"],
                    "p50_us": got["p50_us"], "p99_us": got["p99_us"], "bare_steps_per_s": bare["steps_per_s"],
                    "bare_p50_us": bare["p50_us"], "bare_p99_us": bare["p99_us"]})
    return StepsRow(shape, row, out)


def bare_row(shape: Shape, rows: list[StepsRow]) -> StepsRow:
    """The shape's bare runs (every row's, each round's) as a row of their own: the 1.000 the others are over"""
    bare = [{"ratio": 1.0, "steps_per_s": r["bare_steps_per_s"], "p50_us": r["bare_p50_us"],
             "p99_us": r["bare_p99_us"], "bare_steps_per_s": r["bare_steps_per_s"], "bare_p50_us": r["bare_p50_us"],
             "bare_p99_us": r["bare_p99_us"]} for row in rows if row.shape == shape for r in row.rounds]
    return StepsRow(shape, "bare", bare)
