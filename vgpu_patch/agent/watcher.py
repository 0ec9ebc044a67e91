"""Wake the agent when the library directory changes: inotify through ctypes on Linux, else polling.

No extra dependency: inotify_init1/inotify_add_watch come from the C library. Either way the agent
also re-checks every interval, so a missed event only delays a repair by one interval.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import struct
import sys
import threading
from pathlib import Path

# <sys/inotify.h>
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
# A plain in-place `cp` (HAMi's copy-back) ends with IN_CLOSE_WRITE; a rename-over gives IN_MOVED_TO.
WATCH_MASK = (IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
              | IN_MOVE_SELF | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")


def relevant(name: str) -> bool:
    """Events on the library files or ld.so.preload matter; our temp files and state dir do not."""
    return name.startswith("libvgpu.so") or name == "ld.so.preload"


class PollWatcher:
    """Sleeps for the interval; the caller re-checks the directory on every wake-up."""

    kind = "poll"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stop = threading.Event()

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True only when woken for a reason (never, for polling)."""
        self._stop.wait(timeout)
        return False

    def wake(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()

    def __enter__(self) -> PollWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InotifyWatcher(PollWatcher):
    """Blocks on an inotify descriptor for the directory (re-added when the directory is replaced)."""

    kind = "inotify"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd
        self._wake_r, self._wake_w = os.pipe()
        self._watching = False
        self._poll = select.poll()  # never select(): the descriptors may be numbered above 1024
        for f in (fd, self._wake_r):
            self._poll.register(f, select.POLLIN)
        self._watch()

    def _watch(self) -> None:
        if self._add(self.fd, os.fsencode(self.directory), WATCH_MASK) < 0:
            self._watching = False  # directory missing for now: the interval re-check retries
        else:
            self._watching = True

    def wait(self, timeout: float) -> bool:
        if not self._watching:
            self._watch()
        try:
            ready = [fd for fd, _ in self._poll.poll(max(0.0, timeout) * 1000)]
        except InterruptedError:
            return False
        if self._wake_r in ready:
            os.read(self._wake_r, 512)
        if self.fd not in ready:
            return False
        return self._drain()

    def _drain(self) -> bool:
        hit = False
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return hit
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            pos = 0
            while pos + _EVENT.size <= len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, pos)
                raw = data[pos + _EVENT.size : pos + _EVENT.size + size]
                pos += _EVENT.size + size
                name = raw.split(b"\0", 1)[0].decode(errors="replace")
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    self._watching = False
                    hit = True
                elif mask & IN_Q_OVERFLOW or relevant(name):
                    hit = True

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        for fd in (getattr(self, "fd", -1), getattr(self, "_wake_r", -1), getattr(self, "_wake_w", -1)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self._wake_r = self._wake_w = -1


def make_watcher(directory: Path, prefer: str = "auto") -> PollWatcher:
    """inotify on Linux when it works (prefer='auto'|'inotify'), else polling; prefer='poll' forces polling."""
    if prefer != "poll" and sys.platform.startswith("linux"):
        try:
            return InotifyWatcher(directory)
        except (OSError, AttributeError):
            if prefer == "inotify":
                raise
    return PollWatcher(directory)
