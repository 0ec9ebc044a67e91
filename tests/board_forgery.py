"""What a neighbour can write into the activity board (c_src/limiter/board.c): entries that check, and the
liveness locks that make them look alive. Used by the board and share tests over the simulator and on the
real driver."""
from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from pathlib import Path

ENTRY, ENTRIES = 64, 63  # bytes an entry, entries after the header
HIGH_TAG = 0x80000001  # a container tag with board.h's VGPU_BOARD_HIGH: priority 0
F_OFD_SETLK = 37


def entry_checksum(words: list[int]) -> int:
    """board.c's checksum() over an entry's first seven words"""
    h = 0x9E3779B97F4A7C15
    for w in words:
        h ^= w
        h = (h * 0xFF51AFD7ED558CCD) & (2**64 - 1)
        h ^= h >> 33
    return h | 1


def forged_entry(now: int, busy: bool = True, tag: int = 1) -> bytes:
    """an entry that checks: owner, since, until, total, born, pid, tag, freed, then the checksum"""
    head = struct.pack("<QqqqqiIQ", 0xBAD, now - 10**9, now + (9 * 10**9 if busy else 0), 0, now - 10**9, 4242, tag,
                       0)
    return head + struct.pack("<Q", entry_checksum(list(struct.unpack("<7Q", head))))


def forge_all(path: Path, entries: range, tag: int = 1) -> None:
    """busy entries that check, written over the given ones"""
    now = time.monotonic_ns()
    with open(path, "r+b") as f:
        for i in entries:
            f.seek(ENTRY * i)
            f.write(forged_entry(now, tag=tag))


def hold_locks(path: Path, entries: range) -> int:
    """what an attacker does to keep forged entries 'alive': hold their liveness locks (OFD locks)"""
    fd = os.open(path, os.O_RDWR)
    for i in entries:
        lk = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, ENTRY * (ENTRIES + 1) + i, 1, 0)
        fcntl.fcntl(fd, F_OFD_SETLK, lk)
    return fd


def idle_entry(now: int) -> bytes:
    """an entry that checks, showed use 1 ms ago and never grows: what a forger rewrites to look recent"""
    head = struct.pack("<QqqqqiIQ", 0xBAD, now - 10**9, now - 10**6, 0, now - 10**9, 4242, 1, 0)
    return head + struct.pack("<Q", entry_checksum(list(struct.unpack("<7Q", head))))


def keep_forging(path: Path, kind: str, every: float, stop: threading.Event) -> None:
    """A forger's loop until stop: every entry rewritten as busy or as idle (recently used, never growing)
    every `every` seconds, over whatever its owner wrote there."""
    while not stop.is_set():
        now = time.monotonic_ns()
        with open(path, "r+b") as f:
            for i in range(1, ENTRIES + 1):
                f.seek(ENTRY * i)
                f.write(forged_entry(now) if kind == "busy" else idle_entry(now))
        stop.wait(every)


def forge_for(path: Path, seconds: float, fds: list[int], tag: int = 1) -> None:
    """A forger for `seconds`: holds the liveness locks of entries 3..63 (their fds into `fds`, for the caller
    to close) and rewrites them as busy with `tag` every millisecond."""
    fds.append(hold_locks(path, range(3, ENTRIES + 1)))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        forge_all(path, range(3, ENTRIES + 1), tag=tag)
        time.sleep(0.001)
