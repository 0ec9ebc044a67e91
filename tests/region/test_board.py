"""The activity board (c_src/limiter/board.c): how long other processes were busy on a GPU between two
moments, kept by each reader from its own looks at the others' running sums, and a file every container
can write, so nothing in it may fault a reader or move its figures far.

Each figure is checked against the writer's own clock readings around its marks, so nothing here
depends on how fast the machine is."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from board_forgery import ENTRIES, ENTRY, forge_all, hold_locks, keep_forging
from regiontools import C_SRC, build_program

from vgpu_patch.shim_build.build import header_dir

PROGRAM = r"""
#include <pthread.h>
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

/* the GPU's own process count the limiter would pass (NVML's): BOARD_PROCS, else unknown */
static int procs(int dev)
{
    const char *n = getenv("BOARD_PROCS");
    (void)dev;
    return n ? atoi(n) : -1;
}

int main(int argc, char **argv)
{
    char line[256];

    if (vgpu_board_join(0, "GPU-test", 7, procs) != 0) {
        printf("no board\n");
        return 1;
    }
    if (!strcmp(argv[1], "reader")) { /* commands on stdin: look | poll MS | read T0 T1 | quit */
        printf("joined %lld\n", now());
        fflush(stdout);
        while (fgets(line, sizeof line, stdin)) {
            long long a, z;
            if (!strncmp(line, "look", 4)) {
                vgpu_board_sample(0);
                printf("looked %lld\n", now());
            } else if (sscanf(line, "poll %lld", &a) == 1) { /* a look every millisecond for a ms */
                long long end = now() + a * 1000000ll;
                while (now() < end)
                    vgpu_board_sample(0), sleep_ms(1);
                printf("polled %lld\n", now());
            } else if (sscanf(line, "read %lld %lld", &a, &z) == 2) {
                printf("busy %lld others %d\n", (long long)vgpu_board_busy(0, a, z), vgpu_board_others(0));
            } else {
                break;
            }
            fflush(stdout);
        }
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

BOARD_NAME = "vgpu-patch-activity2-GPU-test"


@pytest.fixture(scope="module")
def board_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_program(tmp_path_factory.mktemp("board"), "board", PROGRAM, C_SRC / "limiter" / "board.c",
                         C_SRC / "log" / "log.c", includes=(str(header_dir()),))


class Reader:
    """A process that joined the board and looks at it when told to."""

    def __init__(self, exe: Path, env: dict[str, str]) -> None:
        self.p = subprocess.Popen([str(exe), "reader"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        self.joined = int(self._line().split()[1])

    def _line(self) -> str:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        assert line, "the reader died"
        return line

    def ask(self, cmd: str) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self._line()

    def look(self) -> int:
        return int(self.ask("look").split()[1])

    def read(self, t0: int, t1: int) -> tuple[int, int]:
        _, busy, _, others = self.ask(f"read {t0} {t1}").split()
        return int(busy), int(others)

    def close(self) -> int:
        if self.p.poll() is None:
            try:
                self.p.communicate("quit\n", timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        return self.p.returncode


class Board:
    def __init__(self, exe: Path, node: Path) -> None:
        self.exe, self.node, self.env = exe, node, {**os.environ, "VGPU_NODE_DIR": str(node)}
        self.readers: list[Reader] = []

    @property
    def path(self) -> Path:
        return self.node / BOARD_NAME

    def reader(self) -> Reader:
        r = Reader(self.exe, self.env)
        self.readers.append(r)
        return r

    def bursts(self, *steps: int | str) -> list[tuple[int, int, int, int]]:
        p = subprocess.run([str(self.exe), "bursts", *map(str, steps)], env=self.env, capture_output=True,
                           text=True, timeout=60, check=True)
        return [tuple(map(int, ln.split()[1:])) for ln in p.stdout.splitlines()]  # type: ignore[misc]


@pytest.fixture
def board(board_exe: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    b = Board(board_exe, tmp_path)
    yield b
    for r in b.readers:
        assert r.close() == 0


MS = 1_000_000


def between(busy: int, bursts: list[tuple[int, int, int, int]], t0: int, t1: int, slack: int = 0) -> None:
    """busy is what the bursts overlap [t0, t1] by: at least their inner bounds, at most their outer ones"""
    def part(a: int, z: int) -> int:
        return max(0, min(z, t1) - max(a, t0))
    least = sum(part(a1, z0) for _, a1, z0, _ in bursts)
    most = sum(part(a0, z1) for a0, _, _, z1 in bursts)
    assert least - slack <= busy <= most + slack, (busy, least, most)


def test_bursts_between_two_looks_are_counted(board: Board) -> None:
    """However many stretches a neighbour had between two looks, their sum is counted (an in-file history of
    four stretches lost the older ones, and a late harvest took a stretched kernel for one run alone)."""
    r = board.reader()
    t0 = r.look()
    bursts = board.bursts(*[3, 2] * 12)
    t1 = r.look()
    busy, others = r.read(t0, t1)
    assert others == 0  # nobody is busy at either end
    between(busy, bursts, t0, t1)
    assert busy > 30 * MS


def test_only_the_part_inside_the_interval_counts(board: Board) -> None:
    r = board.reader()
    done = threading.Event()
    polled: list[str] = []
    threading.Thread(target=lambda: (polled.append(r.ask("poll 400")), done.set()), daemon=True).start()
    time.sleep(0.02)
    bursts = board.bursts(60, 40, 60, 0)
    assert done.wait(30)
    (_, a1, z0, z1), (b0, _, _, _) = bursts
    mid = (a1 + z0) // 2  # inside the first burst
    busy, _ = r.read(mid, b0)
    between(busy, bursts, mid, b0, slack=2 * MS)  # looks a millisecond apart
    assert busy < z0 - a1  # less than the whole burst, however long the machine made it
    busy, _ = r.read(z1 + 2 * MS, b0 - 2 * MS)  # inside the idle gap between them
    assert busy <= 1 * MS


def test_before_the_first_look_nothing_is_known(board: Board) -> None:
    r = board.reader()
    r.look()
    assert r.read(r.joined - 10 * MS, r.joined + MS)[0] == -1
    now = time.monotonic_ns()
    assert r.read(now, now - MS)[0] == 0  # reversed


def test_a_killed_neighbour_counts_for_nothing(board: Board, board_exe: Path) -> None:
    """Killed while busy, its mark reaches 10 s ahead: nobody holds its liveness lock, so it stops counting
    (when it died, nobody can tell)."""
    r = board.reader()
    p = subprocess.Popen([str(board_exe), "bursts", "10", "hang"], env=board.env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("burst")
        time.sleep(0.05)
        r.look()
        assert r.read(r.joined, time.monotonic_ns())[1] == 1  # busy now
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    time.sleep(0.15)  # the liveness probe is cached for 100 ms
    t0 = r.look()
    time.sleep(0.05)
    t1 = r.look()
    assert r.read(t0, t1) == (0, 0)


# ---- a file every container can write ----

@pytest.mark.parametrize("attack", ["truncate", "zero", "junk"])
def test_a_vandalised_board_never_faults_and_keeps_the_neighbour(board: Board, board_exe: Path, attack: str) -> None:
    """Truncated (a shared mapping would SIGBUS), zeroed or filled with junk over and over while a neighbour is
    busy and a reader looks every millisecond: both exit 0, and the reader keeps counting the neighbour (its
    last rate stands in while its entry reads as junk), never more than the time that passed."""
    r = board.reader()
    busy_one = subprocess.Popen([str(board_exe), "bursts", "600", "0"], env=board.env, stdout=subprocess.PIPE,
                                text=True)
    time.sleep(0.1)
    t0 = r.look()
    stop = threading.Event()

    def vandal() -> None:
        junk = os.urandom(ENTRY * (ENTRIES + 1))
        while not stop.is_set():
            with open(board.path, "r+b") as f:
                if attack == "truncate":
                    f.truncate(0)
                elif attack == "zero":
                    f.write(b"\0" * len(junk))
                else:
                    f.write(junk)
            time.sleep(0.0002)

    t = threading.Thread(target=vandal, daemon=True)
    t.start()
    try:
        r.ask("poll 300")
    finally:
        stop.set()
        t.join()
    t1 = r.look()
    out, _ = busy_one.communicate(timeout=30)
    assert busy_one.returncode == 0 and out.startswith("burst")
    busy, _ = r.read(t0, t1)
    assert 0.5 * (t1 - t0) < busy <= (t1 - t0) + 2 * MS, (busy, t1 - t0)


def test_forged_busy_entries_without_a_living_owner_count_for_nothing(board: Board) -> None:
    r = board.reader()
    forge_all(board.path, range(2, ENTRIES + 1))
    t0 = r.look()
    time.sleep(0.05)
    t1 = r.look()
    assert r.read(t0, t1) == (0, 0)


def test_forged_busy_entries_are_bounded(board: Board) -> None:
    """Forged with their liveness locks held: the board cannot tell, so each look counts at most 8 others
    busy (the limiter bounds it further by NVML's process count: tests/region/test_sm_share.py)."""
    r = board.reader()
    fd = hold_locks(board.path, range(2, ENTRIES + 1))
    try:
        forge_all(board.path, range(2, ENTRIES + 1))
        t0 = r.look()
        time.sleep(0.05)
        t1 = r.look()
        busy, others = r.read(t0, t1)
        assert others <= 8 and busy <= 8 * (t1 - t0), (busy, others)
    finally:
        os.close(fd)


def test_a_tenant_holding_every_entry_keeps_nobody_off(board: Board) -> None:
    """Holding all 63 liveness locks (idle or junk under them) does not keep newcomers off the board: they use
    entries that show no use, without the lock, and see each other."""
    board.path.write_bytes(b"\0" * (ENTRY * (ENTRIES + 1)))
    fd = hold_locks(board.path, range(1, ENTRIES + 1))
    try:
        r = board.reader()
        t0 = r.look()
        bursts = board.bursts(20, 0)
        t1 = r.look()
        busy, _ = r.read(t0, t1)
        between(busy, bursts, t0, t1)
    finally:
        os.close(fd)


def test_a_board_filled_with_busy_forgeries_still_lets_newcomers_read(board: Board) -> None:
    """Every liveness lock held and every entry forged busy: nothing there can be taken, yet a newcomer joins
    (it read as "no board" and charged its kernels as if alone): it reads the others, at most 8 busy at a
    look, and tries for an entry again at its launches."""
    board.path.write_bytes(b"\0" * (ENTRY * (ENTRIES + 1)))
    fd = hold_locks(board.path, range(1, ENTRIES + 1))
    try:
        forge_all(board.path, range(1, ENTRIES + 1))
        r = board.reader()
        t0 = r.look()
        time.sleep(0.05)
        t1 = r.look()
        busy, others = r.read(t0, t1)
        assert 0 < others <= 8 and busy <= 8 * (t1 - t0), (busy, others)
    finally:
        os.close(fd)


def test_a_board_filled_by_a_forger_gives_an_entry_to_newcomers(board: Board) -> None:
    """A forger holds every liveness lock and rewrites each entry every 100 ms as recently used, so none
    looks free: the GPU's own count (3 processes) shows the holders are not on it, and an entry that does
    not grow is taken without its lock. A newcomer's bursts are then counted by a reader, though the forger
    keeps overwriting the entry it took (it moves to another, and the reader follows). Entries forged busy
    are taken too (tests/region/test_sm_share.py: a reader counts those as busy, up to the census)."""
    stop = threading.Event()

    board.path.write_bytes(b"\0" * (ENTRY * (ENTRIES + 1)))
    fd = hold_locks(board.path, range(1, ENTRIES + 1))
    board.env["BOARD_PROCS"] = "3"
    t = threading.Thread(target=keep_forging, args=(board.path, "idle", 0.1, stop), daemon=True)
    t.start()
    try:
        time.sleep(0.15)
        r = board.reader()
        done = threading.Event()
        threading.Thread(target=lambda: (r.ask("poll 600"), done.set()), daemon=True).start()
        bursts = board.bursts(*[20, 10] * 12)  # ~360 ms: a reader keeps ~0.5 s of looks
        assert done.wait(30)
        later = bursts[6:]  # a try for an entry every 100 ms: it has one by the fifth burst
        t0, t1 = later[0][0] - 5 * MS, later[-1][3] + 5 * MS
        busy, _ = r.read(t0, t1)
        least = sum(z0 - a1 for _, a1, z0, _ in later)
        most = sum(z1 - a0 for a0, _, _, z1 in later)
        assert 0.8 * least <= busy <= most + 40 * MS, (busy, least, most)
    finally:
        stop.set()
        t.join()
        os.close(fd)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_a_board_that_is_not_a_plain_file_is_not_used(board: Board, board_exe: Path, tmp_path: Path,
                                                      kind: str) -> None:
    """A symlink is not followed, a second name (a hard link to a file of someone else's) is not chmod-ed
    or written, a FIFO is not opened for good: the process runs without a board."""
    other = tmp_path / "elsewhere"
    other.write_bytes(b"\0" * 100)
    other.chmod(0o600)
    if kind == "symlink":
        board.path.symlink_to(other)
    elif kind == "hardlink":
        os.link(other, board.path)
    else:
        os.mkfifo(board.path)
    p = subprocess.run([str(board_exe), "reader"], env=board.env, input="quit\n", capture_output=True, text=True,
                       timeout=30)
    assert p.stdout.strip() == "no board", p.stdout
    assert other.read_bytes() == b"\0" * 100 and (other.stat().st_mode & 0o777) == 0o600
