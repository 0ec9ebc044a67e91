"""The activity board's history (c_src/limiter/board.c): how long other processes were busy on a GPU
between two moments, not only whether they are busy now. A throttled neighbour runs in bursts between
sleeps; two looks at the board (at a launch and at its harvest) missed a burst in between, and the
limiter then charged a kernel that burst had stretched in full (on an H200, a fifth of the measured
launches of one container's two processes at 50: that container got 0.39-0.44 of the GPU).

Each figure is checked against the writer's own clock readings around its marks, so nothing here
depends on how fast the machine is."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from regiontools import C_SRC, build_program

from vgpu_patch.shim_build.build import header_dir

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "limiter/board.h"

static long long now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000l};
    nanosleep(&ts, 0);
}

int main(int argc, char **argv)
{
    if (vgpu_board_join(0, "GPU-test") != 0) {
        printf("no board\n");
        return 1;
    }
    if (!strcmp(argv[1], "read")) { /* read T0 T1: others' busy ns within [T0, T1], and how many are busy now */
        printf("busy %lld others %d\n", (long long)vgpu_board_busy(0, atoll(argv[2]), atoll(argv[3])),
               vgpu_board_others(0));
        return 0;
    }
    /* bursts BUSY_MS GAP_MS ...: busy (a thread waiting for the GPU) then idle, in turn; each burst's
     * bounds: the clock before it began and after it ended, and after it began and before it ended */
    for (int i = 2; i + 1 < argc; i += 2) {
        long long a0 = now(), a1, z0, z1;
        vgpu_board_hold(0);
        a1 = now();
        sleep_ms(atol(argv[i]));
        z0 = now();
        vgpu_board_release(0);
        z1 = now();
        printf("burst %lld %lld %lld %lld\n", a0, a1, z0, z1);
        fflush(stdout);
        if (!strcmp(argv[i + 1], "hang")) /* busy until killed */
            vgpu_board_hold(0), sleep_ms(60000);
        sleep_ms(atol(argv[i + 1]));
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def board_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_program(tmp_path_factory.mktemp("board"), "board", PROGRAM, C_SRC / "limiter" / "board.c",
                         C_SRC / "log" / "log.c", includes=(str(header_dir()),))


class Board:
    def __init__(self, exe: Path, node: Path) -> None:
        self.exe, self.env = exe, {**os.environ, "VGPU_NODE_DIR": str(node)}

    def bursts(self, *steps: int | str) -> list[tuple[int, int, int, int]]:
        p = subprocess.run([str(self.exe), "bursts", *map(str, steps)], env=self.env, capture_output=True,
                           text=True, timeout=60, check=True)
        return [tuple(map(int, ln.split()[1:])) for ln in p.stdout.splitlines()]  # type: ignore[misc]

    def read(self, t0: int, t1: int) -> tuple[int, int]:
        p = subprocess.run([str(self.exe), "read", str(t0), str(t1)], env=self.env, capture_output=True, text=True,
                           timeout=60, check=True)
        _, busy, _, others = p.stdout.split()
        return int(busy), int(others)


@pytest.fixture
def board(board_exe: Path, tmp_path: Path) -> Board:
    return Board(board_exe, tmp_path)


US = 1000  # stretches are kept to the microsecond


def between(busy: int, bursts: list[tuple[int, int, int, int]], t0: int, t1: int) -> None:
    """busy is what the bursts overlap [t0, t1] by: at least their inner bounds, at most their outer ones"""
    def part(a: int, z: int) -> int:
        return max(0, min(z, t1) - max(a, t0))
    least = sum(part(a1, z0) for _, a1, z0, _ in bursts)
    most = sum(part(a0, z1) for a0, _, _, z1 in bursts)
    assert least - 2 * US * len(bursts) <= busy <= most + 2 * US * len(bursts), (busy, least, most)


def test_bursts_between_two_looks_are_counted(board: Board) -> None:
    t0 = time.monotonic_ns()
    bursts = board.bursts(30, 20, 15, 0)
    t1 = time.monotonic_ns()
    busy, others = board.read(t0, t1)
    assert others == 0  # nobody is busy at either end: two looks saw nothing
    assert busy > 40_000_000
    between(busy, bursts, t0, t1)


def test_only_the_part_inside_the_interval_counts(board: Board) -> None:
    bursts = board.bursts(30, 20, 30, 0)
    (_, a1, z0, z1), (b0, _, _, _) = bursts
    mid = (a1 + z0) // 2  # inside the first burst
    busy, _ = board.read(mid, b0)
    between(busy, bursts, mid, b0)
    assert busy < z0 - a1  # less than the whole burst, however long the machine made it
    busy, _ = board.read(z1, b0)  # the idle gap between them
    assert busy == 0


def test_more_bursts_than_the_history_keeps_never_count_more(board: Board) -> None:
    """Four earlier stretches and the current one are kept: an older one is not counted, never invented."""
    t0 = time.monotonic_ns()
    bursts = board.bursts(*[5, 5] * 8)
    t1 = time.monotonic_ns()
    busy, _ = board.read(t0, t1)
    kept = bursts[-5:]
    between(busy, kept, t0, t1)


def test_a_killed_neighbour_counts_for_nothing(board: Board, board_exe: Path) -> None:
    """Killed while busy, its mark reaches 10 s ahead: nobody holds its liveness lock, so it is not counted
    (when it died, nobody can tell)."""
    t0 = time.monotonic_ns()
    p = subprocess.Popen([str(board_exe), "bursts", "10", "hang"], env=board.env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("burst")
        time.sleep(0.05)
        assert board.read(t0, time.monotonic_ns())[1] == 1  # busy now
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    time.sleep(0.15)  # the liveness probe is cached for 100 ms
    busy, others = board.read(t0, time.monotonic_ns())
    assert (busy, others) == (0, 0)


def test_a_window_in_the_future_or_reversed_counts_nothing(board: Board) -> None:
    board.bursts(5, 0)
    now = time.monotonic_ns()
    assert board.read(now + 10**9, now + 2 * 10**9)[0] == 0
    assert board.read(now, now - 10**6)[0] == 0
