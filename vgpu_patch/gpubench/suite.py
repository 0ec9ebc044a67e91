"""The run `vgpu-patch bench` makes on a GPU node: the shim and region_gpu built from this package's own sources in
a temporary directory, then each part's rows (steps, shares, onset), bare and MPS beside the shim, every round
kept for the record."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, TypeVar

from .. import __version__
from ..report.errors import GpuError
from ..shim_build.build import build_shim
from . import PARTS
from .mps import mps_daemon, mps_env
from .onset import PREFILL, Cold, Onset, cold, onset_rows, onset_run
from .program import LONG_ITERS, Shim, build_region_gpu
from .shares import ShareRow, ShareRunner, share_rows, startup_seconds
from .steps import SHAPES, Shape, StepsRow, bare_row, charge_rows, measure_steps, mps_rows

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    seconds: float = 2.0  # each timed run
    rounds: int = 3
    limits: tuple[int, ...] = (50, 25)
    parts: tuple[str, ...] = PARTS
    mps_absent: str | None = None  # why MPS is not measured (not installed, not asked for); None: it is


@dataclass
class Shares:
    bare_kernels_per_s: float  # one bare process alone: the 1.0 of every share
    rows: list[ShareRow]

    def to_json(self) -> dict[str, Any]:
        return {"bare_kernels_per_s": self.bare_kernels_per_s, "rows": [r.to_json() for r in self.rows]}


@dataclass
class OnsetRow:
    row: str
    fresh: Cold
    after_prefill: Cold | None  # None for the unlimited row: nothing to hold
    onset: Onset | None

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row, "cold_fresh": self.fresh.to_json(),
                "cold_after_prefill": self.after_prefill.to_json() if self.after_prefill else None,
                "onset": self.onset.to_json() if self.onset else None}


def _quiet(_line: str) -> None:
    pass


class Bench:
    """The programs, built in `tmp` (BuildError when they cannot be), and the run's state; each part a method"""

    def __init__(self, tmp: Path, plan: Plan, progress: Callable[[str], None] = _quiet) -> None:
        self.tmp, self.plan, self.progress = tmp, plan, progress
        self.limits = list(plan.limits)
        self.build = build_shim(tmp / "shim", compiler="gcc", glibc=None)
        self.shim = Shim(self.build.library, tmp)
        self.exe = build_region_gpu(tmp / "region_gpu")
        self.startup = startup_seconds(self.exe)  # and so region_gpu, the driver and a context work here
        # a row's processes start together and contend for the driver while they make their contexts: three times
        # what a lone one takes, and never under half a second
        self.lead = max(0.5, 3 * self.startup)
        self.mps_absent = plan.mps_absent

    def _under_mps(self, body: Callable[[], list[T]]) -> list[T]:
        """body() with our MPS daemon up; a failure of MPS ends MPS for the run (its reason kept), not the bench"""
        if self.mps_absent:
            return []
        try:
            with mps_daemon(self.tmp):
                startup_seconds(self.exe, mps_env(self.tmp))  # the first client starts the server: not in a timed run
                return body()
        except GpuError as e:
            self.mps_absent = f"MPS failed: {e}"
            self.progress(self.mps_absent)
            return []

    def steps(self) -> list[StepsRow]:
        p = self.plan
        rows: list[StepsRow] = []
        for shape in SHAPES:
            ours = []
            for name, extra in charge_rows(self.limits):
                self.progress(f"steps: {shape.name}: {name}")
                ours.append(measure_steps(self.exe, p.seconds, shape, name, partial(self.shim.env, extra), p.rounds))

            def mps(shape: Shape = shape) -> list[StepsRow]:
                out = []
                for name, extra in mps_rows(self.limits):
                    self.progress(f"steps: {shape.name}: {name}")
                    out.append(measure_steps(self.exe, p.seconds, shape, name,
                                             partial(dict, mps_env(self.tmp), **extra), p.rounds))
                return out

            theirs = self._under_mps(mps)
            rows += [bare_row(shape, ours + theirs), *ours, *theirs]
        return rows

    def shares(self) -> Shares:
        p = self.plan
        runner = ShareRunner(self.exe, self.build.library, self.tmp / "shares", p.seconds, lead=self.lead)

        def measure(how: str) -> list[ShareRow]:
            out = []
            for name, cs in share_rows(self.limits, how):
                self.progress(f"shares: {name}")
                got = [runner.run(cs, LONG_ITERS, shim=how == "shim", mps=how == "mps") for _ in range(p.rounds)]
                out.append(ShareRow(name, how, cs, got))
            return out

        self.progress("shares: one bare process alone (the 1.0 of every share)")
        bare = runner.bare(LONG_ITERS)
        return Shares(bare, measure("shim") + measure("bare") + self._under_mps(partial(measure, "mps")))

    def onset(self) -> list[OnsetRow]:
        p = self.plan
        out = []
        for name, extra in onset_rows(self.limits):
            self.progress(f"onset: {name}")
            env = partial(self.shim.env, extra)
            fresh = cold(self.exe, env, 0, p.rounds, f"cold start, {name}")
            if not extra:  # the shim's own cost alone: nothing to throttle, so no prefill or onset rows
                out.append(OnsetRow(name, fresh, None, None))
                continue
            after = cold(self.exe, env, PREFILL, p.rounds, f"cold start after prefill, {name}")
            out.append(OnsetRow(name, fresh, after, onset_run(self.exe, env, p.rounds, f"onset, {name}")))
        return out

    def document(self, info: dict[str, Any], parts: dict[str, Any]) -> dict[str, Any]:
        """Everything measured, for --json: the raw rounds beside the medians"""
        doc: dict[str, Any] = {
            "vgpu_patch": __version__, "gpu": info,
            "shim": {"version": f"vgpu-patch-shim {__version__}", "sha256": self.build.sha256},
            "settings": {"seconds": self.plan.seconds, "rounds": self.plan.rounds, "limits": self.limits,
                         "parts": list(self.plan.parts), "share_spin_iters": LONG_ITERS,
                         "share_lead_s": self.lead, "startup_s": self.startup},
            "mps": {"measured": self.mps_absent is None, "absent": self.mps_absent},
        }
        for part, got in parts.items():
            doc[part] = got.to_json() if isinstance(got, Shares) else [r.to_json() for r in got]
        return doc
