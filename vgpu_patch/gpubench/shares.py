"""Compute shares of one GPU: containers (each its own region file) of one or more processes running region_gpu's
compute-bound loop at once, under the shim, bare or under MPS.

A share is a container's kernels per second over what one process alone, without the shim, gets with the same
kernels."""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..report.errors import GpuError
from .mps import mps_env
from .program import Shim, clean_env, result
from .stats import Spread


@dataclass
class Container:
    limit: int | None  # CUDA_DEVICE_SM_LIMIT (or the MPS thread percentage); None: none
    procs: int = 1
    arrives: float = 0.0  # seconds after the first container's loop began (a pod that starts later)
    env: dict[str, str] = field(default_factory=dict)  # more of its environment (CUDA_TASK_PRIORITY, say)


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one takes everything"""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


class ShareRunner:
    def __init__(self, exe: Path, shim: Path, tmp: Path, seconds: float = 3.0, lead: float = 2.5) -> None:
        """`lead`: seconds from starting the processes to their loops' common start, time enough for every
        process to have its context (a PyTorch process takes longer)"""
        self.exe, self.tmp, self.seconds, self.lead = exe, tmp, seconds, lead
        self.shim = Shim(shim, tmp)
        self.node = self.shim.node  # the activity board's directory
        self._bare: dict[int, float] = {}

    def run(self, containers: list[Container], iters: int, shim: bool = True, mps: bool = False,
            trace: Path | None = None) -> list[float]:
        """Every process of every container, each container's loop beginning `arrives` seconds after the first
        one's; each container's share of a lone bare process over one common window that opens a second after
        the last arrival (so a late container meets the others busy, as a pod that starts later does).
        `trace`: a directory where each process writes its kernels' timeline (c<container>p<process>.txt)."""
        start_at = time.monotonic() + self.lead  # after every process has its context
        last = max(c.arrives for c in containers)
        window = (start_at + last + 1.0, start_at + last + 1.0 + self.seconds) if last else None
        procs: list[tuple[int, subprocess.Popen[str]]] = []
        for c, spec in enumerate(containers):
            extra: dict[str, str] = {}
            if shim:
                extra.update(self.shim.env({"CUDA_DEVICE_SM_LIMIT": str(spec.limit)} if spec.limit else {}))
            if mps:
                extra.update(mps_env(self.tmp))
                if spec.limit:
                    extra["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(spec.limit)
            extra.update(spec.env)
            if window:
                extra["LOOP_WINDOW"] = f"{window[0]:.3f},{window[1]:.3f}"
            begin = start_at + spec.arrives
            seconds = window[1] + 0.2 - begin if window else self.seconds
            for i in range(spec.procs):
                env = clean_env({"SPIN_ITERS": str(iters), "LOOP_START_AT": f"{begin:.3f}", **extra})
                if trace:
                    env["LOOP_TRACE"] = str(trace / f"c{c}p{i}.txt")
                p = subprocess.Popen([str(self.exe), "loop", f"{seconds:.3f}"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                procs.append((c, p))
        rates = [0.0] * len(containers)
        cmd = f"{self.exe.name} loop"
        try:
            for c, p in procs:
                try:
                    out, err = p.communicate(timeout=120 + self.lead + last + self.seconds)
                except subprocess.TimeoutExpired:
                    raise GpuError(f"container {c + 1} of {len(containers)}: `{cmd}` still ran after its time and "
                                   "two minutes more: is the GPU hung or held by other work? (nvidia-smi)") from None
                kv = result(f"container {c + 1} of {len(containers)}", cmd, p.returncode, out, err)
                rates[c] += float(kv["window_kernels_per_s" if window else "kernels_per_s"])
        finally:
            for _, p in procs:  # none left behind when one fails
                if p.poll() is None:
                    p.kill()
                    p.wait()
        bare = self.bare(iters)
        return [r / bare for r in rates]

    def bare(self, iters: int) -> float:
        """One process alone, without the shim: the 1.0 every share is measured against (kernels/s)."""
        if iters not in self._bare:
            self._bare[iters] = 1.0
            self._bare[iters] = max(self.run([Container(None)], iters, shim=False)[0] for _ in range(2))
        return self._bare[iters]


def startup_seconds(exe: Path, extra: dict[str, str] | None = None) -> float:
    """How long one bare process takes from its start to its loop (driver, context, JIT, a kernel) and back out:
    the measure of how long the processes of a row need before they can begin together"""
    t0 = time.monotonic()
    p = subprocess.run([str(exe), "loop", "0"], env=clean_env(extra), capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    result("starting region_gpu", f"{exe.name} loop 0", p.returncode, p.stdout, p.stderr)
    return took


@dataclass
class ShareRow:
    row: str
    how: str  # shim, bare or mps
    containers: list[Container]
    rounds: list[list[float]]  # each round: every container's share

    @property
    def shares(self) -> list[Spread]:
        return [Spread.of(list(c)) for c in zip(*self.rounds)]

    @property
    def total(self) -> Spread:
        return Spread.of([sum(r) for r in self.rounds])

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row, "how": self.how, "limits": [c.limit for c in self.containers],
                "procs": [c.procs for c in self.containers], "rounds": self.rounds,
                "shares": [s.to_json() for s in self.shares], "sum": self.total.to_json()}


def share_rows(limits: list[int], how: str) -> list[tuple[str, list[Container]]]:
    """The co-tenant rows `vgpu-patch bench` runs, named as bench/sm_share.py names them: under the shim (how=shim)
    one process at each limit, two containers at the first limit each, 30 / 70 and the first limit beside an
    unlimited container; bare (how=bare) the pair time-slicing gives; under MPS (how=mps) the same limits as
    thread percentages"""
    first, C = limits[0], Container
    if how == "bare":
        return [("bare pair (time-slicing ceiling)", [C(None), C(None)])]
    if how == "mps":
        return ([(f"MPS one process, {lim}", [C(lim)]) for lim in limits]
                + [(f"MPS {first} / {first}", [C(first), C(first)]), ("MPS 30 / 70", [C(30), C(70)])])
    return ([(f"one process, {lim}", [C(lim)]) for lim in limits]
            + [(f"two containers {first} / {first}", [C(first), C(first)]), ("two containers 30 / 70", [C(30), C(70)]),
               (f"{first} beside an unlimited container", [C(first), C(None)])])
