"""`vgpu-patch bench`: what the shim's SM limits do on this node's GPU, beside bare time-slicing and MPS."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from ..gpubench import PARTS
from .options import emit_json, json_option, verbose_option

if TYPE_CHECKING:
    from rich.console import Console

    from ..gpubench.steps import StepsRow
    from ..gpubench.suite import OnsetRow, Shares

EPILOG = """\b
Examples:
  vgpu-patch bench                                  # every part: about 7 minutes
  vgpu-patch bench --only steps --rounds 5
  vgpu-patch bench --limits 30 --no-mps --json > bench.json

\b
Parts (each row a fresh process, or several at once, with a region of its own):
  steps   decode-like steps (one kernel, then a sync) of three shapes, one process: steps/s over
          the same loop bare, p50 and p99 step latency; the shim's time and occupancy charges
          (VGPU_SM_CHARGE) at each limit, MPS at each limit
  shares  containers running a compute-bound loop at once: each one's kernels/s over one bare
          process alone (one process at each limit, two containers at the first limit, 30 / 70,
          the first limit beside an unlimited container, the bare pair; MPS the same)
  onset   a fresh process's first 100 decode steps (cold, and after 200 long kernels) over a bare
          one's, and when a limit takes hold after 200 ms idle (hold_ms: 20 or less is the aim)
  Each figure is the median of the rounds, their spread (min-max) beside it.

\b
Needs the NVIDIA driver (libcuda.so.1), gcc and the CUDA headers (the [build] extra's or a CUDA
toolkit's): the shim and the GPU program are built from this install's sources in a temporary
directory. MPS rows need nvidia-cuda-mps-control on PATH; the bench runs a daemon of its own,
private to the run. Run it on an idle GPU: other work there changes every figure.
"""


def _limits(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        limits = tuple(dict.fromkeys(int(x) for x in value.split(",") if x.strip()))
    except ValueError:
        limits = ()
    if not limits or not all(1 <= x <= 100 for x in limits):
        raise click.BadParameter(f"{value!r}: give whole percentages from 1 to 100, comma-separated, e.g. 50,25")
    return limits


def _us(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _steps_table(rows: list[StepsRow]) -> Any:
    from rich.table import Table

    t = Table(title="decode-like steps: one process, one kernel then a sync; steps/s over bare")
    for col in ("shape", "row", "steps/s over bare", "p50 µs", "p99 µs", "p99/p50"):
        t.add_column(col, justify="left" if col in ("shape", "row") else "right")
    for i, r in enumerate(rows):
        first = i == 0 or rows[i - 1].shape != r.shape
        last = i == len(rows) - 1 or rows[i + 1].shape != r.shape
        p50, p99 = r.median("p50_us"), r.median("p99_us")
        t.add_row(r.shape.name if first else "", r.row, r.ratio.text(), _us(p50), _us(p99), f"{p99 / p50:.2f}",
                  end_section=last)
    return t


def _shares_table(got: Shares) -> Any:
    from rich.table import Table

    t = Table(title=f"co-tenant shares: each container's kernels/s over one bare process alone "
                    f"({got.bare_kernels_per_s:.1f}/s)")
    for col in ("row", "shares", "sum"):
        t.add_column(col, justify="right" if col == "sum" else "left")
    for r in got.rows:
        t.add_row(r.row, " / ".join(s.text() for s in r.shares), r.total.text() if len(r.containers) > 1 else "")
    return t


def _onset_table(rows: list[OnsetRow]) -> Any:
    from rich.table import Table

    from ..gpubench.stats import Spread

    t = Table(title="cold start (median of the first 100 steps, over bare) and limit onset after 200 ms idle")
    for col in ("row", "cold p50 over bare", "after prefill", "hold ms"):
        t.add_column(col, justify="left" if col == "row" else "right")
    for r in rows:
        hold = "-"
        if r.onset:
            spread = Spread.of(r.onset.hold_ms)
            hold = "never held" if spread.max < 0 else spread.text(".1f")
        t.add_row(r.row, Spread.of(r.fresh.over_bare).text(),
                  Spread.of(r.after_prefill.over_bare).text() if r.after_prefill else "-", hold)
    return t


def _console(stream: IO[str]) -> Console:
    from rich.console import Console

    return Console(file=stream, highlight=False, soft_wrap=True, width=None if stream.isatty() else 200)


@click.command("bench", epilog=EPILOG)
@verbose_option
@click.option("--seconds", type=click.FloatRange(min=0.1), default=2.0, show_default=True, metavar="S",
              help="How long each timed run lasts.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, metavar="N",
              help="Runs of each row; a figure is their median, with their spread.")
@click.option("--limits", default="50,25", show_default=True, callback=_limits, metavar="L[,L...]",
              help="SM limits to measure (CUDA_DEVICE_SM_LIMIT, and MPS's thread percentage).")
@click.option("--only", type=click.Choice(PARTS), multiple=True,
              help="Run only this part (repeatable) [default: steps, shares and onset].")
@click.option("--no-mps", is_flag=True, help="Leave the MPS rows out even where MPS is installed.")
@json_option
def cli(seconds: float, rounds: int, limits: tuple[int, ...], only: tuple[str, ...], no_mps: bool,
        as_json: bool) -> None:
    """Measure what the shim's SM limits do on this node's GPU, beside bare and MPS.

    Builds the shim and a small GPU program, then prints three tables: decode-like steps, co-tenant
    shares and cold start / limit onset. With --json the tables go to stderr and one document with
    every round's figures, the GPU, its driver and the shim's version goes to stdout.

    Example: vgpu-patch bench --seconds 2 --rounds 3
    """
    from .. import __version__
    from ..gpubench import driver
    from ..gpubench.mps import mps_missing
    from ..gpubench.suite import Bench, Plan

    info = driver.probe()  # no driver, no GPU: one line, before anything is built
    parts = tuple(p for p in PARTS if not only or p in only)
    plan = Plan(seconds, rounds, limits, parts, "left out (--no-mps)" if no_mps else mps_missing())
    out, err = _console(sys.stderr if as_json else sys.stdout), _console(sys.stderr)
    out.print(f"{info.describe()}; vgpu-patch-shim {__version__}; {seconds:g} s a run, {rounds} round(s), "
              f"SM limits {', '.join(map(str, limits))}")
    if plan.mps_absent:
        out.print(f"MPS rows: absent, {plan.mps_absent}", style="dim", markup=False)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as d:
        bench = Bench(Path(d), plan, progress=lambda line: err.print(f"bench: {line}", style="dim", markup=False))
        results: dict[str, Any] = {}
        for part in parts:
            got = results[part] = getattr(bench, part)()
            out.print(_steps_table(got) if part == "steps" else _shares_table(got) if part == "shares"
                      else _onset_table(got))
        if bench.mps_absent and not plan.mps_absent:  # MPS failed along the way
            out.print(f"MPS rows: absent, {bench.mps_absent}", style="dim", markup=False)
        doc = bench.document(info.to_json(), results)
    if as_json:
        emit_json(doc)
