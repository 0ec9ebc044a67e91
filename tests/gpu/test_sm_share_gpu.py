"""SM limits as real shares of a real GPU (run on the H200: `pytest tests/gpu --gpu -s`): one budget
per container, fair between containers (tests/region/test_sm_share.py proves the same over a
simulated GPU in CI; bench/sm_share.py prints the whole table beside MPS)."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import board_forgery
import pytest

from vgpu_patch.gpubench.program import LONG_ITERS, SHORT_ITERS
from vgpu_patch.gpubench.shares import Container, ShareRunner, jain

from .conftest import Gpu

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def runner(gpu: Gpu, region_gpu: Path) -> ShareRunner:
    return ShareRunner(region_gpu, gpu.shim, gpu.tmp / "shares")


@pytest.mark.parametrize("iters", [LONG_ITERS, SHORT_ITERS], ids=["long", "short"])
def test_one_budget_per_container(runner: ShareRunner, iters: int) -> None:
    [two] = runner.run([Container(50, 2)], iters)
    [three] = runner.run([Container(30, 3)], iters)
    print(f"\nFIGURE one container, iters {iters}: 2 processes at 50 -> {two:.3f}, 3 at 30 -> {three:.3f}")
    # the target, within 0.03 of the limit: 0.493-0.509 and 0.288-0.303 on the H200 with the board's
    # busy history (docs/benchmarks.md#sm-shares); without it 2 x 50 gave 0.39-0.48 and 3 x 30 0.25-0.29, and
    # an older board marking gave 3 x 30 up to 0.376
    assert abs(two - 0.50) <= 0.03 and abs(three - 0.30) <= 0.03


@pytest.mark.parametrize("iters", [LONG_ITERS, SHORT_ITERS], ids=["long", "short"])
def test_containers_share_fairly(runner: ShareRunner, iters: int) -> None:
    half = runner.run([Container(50), Container(50)], iters)
    quarter = runner.run([Container(25), Container(25)], iters)
    beside = runner.run([Container(50), Container(None)], iters)
    print(f"\nFIGURE containers, iters {iters}: 50/50 -> {half}, 25/25 -> {quarter}, 50 beside none -> {beside}")
    ceiling = runner.run([Container(None), Container(None)], iters, shim=False)  # what time-slicing gives
    assert min(half) >= min(0.42, 0.9 * min(ceiling)) and jain(half) >= 0.98
    # long: 0.247-0.258 with the board's busy history, 0.217-0.312 without it. Short batches pay the GPU's turns
    # (C_2 0.64): 0.236 / 0.227 on the H200, the floor 0.9 x 0.25 x C_2 = 0.144
    floor = min(0.23, 0.9 * 0.25 * sum(ceiling))
    assert all(floor <= q <= 0.27 for q in quarter) and jain(quarter) >= 0.98, (quarter, ceiling)
    assert beside[0] >= min(0.42, 0.9 * min(ceiling))


@pytest.mark.parametrize("cs", [
    [Container(90), Container(10, arrives=1.0)],
    [Container(10), Container(90, arrives=1.0)],
    [Container(70), Container(30, arrives=0.3)],
    [Container(30), Container(70, arrives=0.3)],
    [Container(None), Container(50, arrives=1.0)],
], ids=["90-then-10", "10-then-90", "70-then-30", "30-then-70", "none-then-50"])
@pytest.mark.parametrize("iters", [LONG_ITERS, SHORT_ITERS], ids=["long", "short"])
def test_a_late_container_gets_its_share(runner: ShareRunner, cs: list[Container], iters: int) -> None:
    """A container that starts while another is busy: each gets at least 0.9 x its limit x what two bare
    processes get together (C_2), never more than its limit + 0.02. With a four-stretch history in the board
    the late 10 got 0.055 and the late 30 0.211 on the H200; 0.100 and 0.295 with each reader's own history.
    Short kernels take a turn of the GPU per batch (C_2 0.636): charged only their kernels, a 30 beside a 70 got
    0.300 / 0.326; charged the turn to it too, 0.177 / 0.609."""
    got = runner.run(cs, iters)
    c2 = sum(runner.run([Container(None), Container(None)], iters, shim=False))
    print(f"\nFIGURE arrivals, iters {iters}, {[(c.limit, c.arrives) for c in cs]}: {got} (C_2 {c2:.3f})")
    for c, share in zip(cs, got):
        if c.limit:
            assert 0.9 * c.limit / 100 * c2 <= share <= c.limit / 100 + 0.02, (c, share)
        else:
            assert share >= 0.9 * 0.5 * c2 * 0.9, share  # the unlimited one keeps about half


HIGH, LOW = {"CUDA_TASK_PRIORITY": "0"}, {"CUDA_TASK_PRIORITY": "1"}


@pytest.mark.parametrize("first", ["low", "high"])
def test_a_busy_high_priority_container_keeps_the_gpu(runner: ShareRunner, first: str) -> None:
    """CUDA_TASK_PRIORITY without HAMi's monitor: a priority-0 and a priority-1 container, both busy and without
    SM limits (time-slicing gives them about half each), the second arriving 0.3 s after the first. The low one
    yields to 5 % of the GPU while the high one is busy, NVML's utilisation confirming the board's claim; alone,
    it runs as without priorities."""
    high, low = Container(None, env=HIGH), Container(None, env=LOW)
    if first == "high":
        got = runner.run([high, Container(None, arrives=0.3, env=LOW)], LONG_ITERS)
        hi, lo = got
    else:
        got = runner.run([low, Container(None, arrives=0.3, env=HIGH)], LONG_ITERS)
        lo, hi = got
    [alone] = runner.run([low], LONG_ITERS)
    print(f"\nFIGURE priority, {first} first: high {hi:.3f}, low {lo:.3f}; the low one alone {alone:.3f}")
    assert hi >= 0.85 and lo <= 0.15 and alone >= 0.90, (hi, lo, alone)


ELASTIC = {"VGPU_SM_ELASTIC": "1"}


def test_an_elastic_container_takes_only_idle_time(runner: ShareRunner) -> None:
    """VGPU_SM_ELASTIC=1: an elastic 30 alone runs at full speed; beside a busy 50 arriving 0.3 s later the 50
    keeps its share (0.9 x 0.5 x C_2) and the 30 at least its own; the 30 first or second alike."""
    [alone] = runner.run([Container(30, env=ELASTIC)], LONG_ITERS)
    el, fifty = runner.run([Container(30, env=ELASTIC), Container(50, arrives=0.3)], LONG_ITERS)
    fifty2, el2 = runner.run([Container(50), Container(30, arrives=0.3, env=ELASTIC)], LONG_ITERS)
    c2 = sum(runner.run([Container(None), Container(None)], LONG_ITERS, shim=False))
    print(f"\nFIGURE elastic 30 alone {alone:.3f}; first {el:.3f} beside a 50 {fifty:.3f}; second {el2:.3f} "
          f"beside a 50 {fifty2:.3f} (C_2 {c2:.3f})")
    assert alone >= 0.85, alone
    for e, f in ((el, fifty), (el2, fifty2)):
        assert f >= 0.9 * 0.5 * c2 and e >= 0.9 * 0.3 * c2, (e, f)


@pytest.mark.parametrize("attack", ["truncate", "zero", "junk"])
def test_a_vandalised_board_crashes_nobody(runner: ShareRunner, attack: str) -> None:
    """A neighbour truncates (the old board, mapped, killed every launching process with SIGBUS: exit 135),
    zeroes or junks the activity board every 200 us while two 50s run on the real driver: both exit 0 (the
    runner asserts it) and keep most of their share."""
    stop = threading.Event()
    junk = os.urandom(64 * 64)

    def vandal() -> None:
        while not stop.is_set():
            for board in runner.node.glob("vgpu-patch-activity2-*"):
                with open(board, "r+b") as f:
                    if attack == "truncate":
                        f.truncate(0)
                    else:
                        f.write(b"\0" * len(junk) if attack == "zero" else junk)
            time.sleep(0.0002)

    t = threading.Thread(target=vandal, daemon=True)
    t.start()
    try:
        got = runner.run([Container(50), Container(50)], LONG_ITERS)
    finally:
        stop.set()
        t.join()
    print(f"\nFIGURE vandalised board ({attack}): 50 / 50 -> {got}")
    assert min(got) >= 0.85 * 0.5 * 0.9, got


@pytest.mark.parametrize(("forgery", "rows"), [("busy", "50/50"), ("idle", "50/50"), ("busy", "none/10")])
def test_a_forger_filling_the_board_bends_no_share(runner: ShareRunner, forgery: str, rows: str) -> None:
    """A tenant holds all 63 liveness locks of the GPU's board and keeps rewriting every entry (busy every
    millisecond, or recently used and idle every 100 ms) while a 50 runs and another arrives 0.3 s later: NVML
    counts 2 processes, so they take entries without the lock and follow each other across them. Both exit 0
    and keep their bands. A 10 arriving beside an unlimited container: the rewrites hide most of the unlimited
    one's time from the board, and NVML's utilisation shows it (limiter.c's busy_floor; 0.056-0.077 over the
    simulated GPU without it)."""
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    board = runner.node / f"vgpu-patch-activity2-{uuid}"
    board.unlink(missing_ok=True)
    board.write_bytes(b"\0" * board_forgery.ENTRY * (board_forgery.ENTRIES + 1))
    fd = board_forgery.hold_locks(board, range(1, board_forgery.ENTRIES + 1))
    stop = threading.Event()
    t = threading.Thread(target=board_forgery.keep_forging,
                         args=(board, forgery, 0.001 if forgery == "busy" else 0.1, stop), daemon=True)
    t.start()
    try:
        cs = [Container(50), Container(50, arrives=0.3)] if rows == "50/50" else [Container(None),
                                                                                   Container(10, arrives=0.3)]
        got = runner.run(cs, LONG_ITERS)
    finally:
        stop.set()
        t.join()
        os.close(fd)
        board.unlink()  # the next test's processes make a board of their own
    c2 = sum(runner.run([Container(None), Container(None)], LONG_ITERS, shim=False))
    print(f"\nFIGURE forged board ({forgery}): {rows} late -> {got} (C_2 {c2:.3f})")
    if rows == "50/50":
        assert min(got) >= 0.9 * 0.5 * c2 and max(got) <= 0.52, got
    else:
        assert 0.9 * 0.1 * c2 <= got[1] <= 0.12 and got[0] >= 0.4, got
