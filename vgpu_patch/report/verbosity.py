"""-v/--verbose on every command (`vgpu-patch -v CMD` too): what the tool does, with timings, on stderr
(never on stdout: --json stays one document). One level for the whole run; each module logs to a child of
the `vgpu_patch` logger (`vgpu_patch.node` for node commands, `vgpu_patch.build`, `vgpu_patch.kube`, ...)."""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

log = logging.getLogger("vgpu_patch")
_level = 0


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (a test runner swaps it between runs), never a stale stream."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def set_level(level: int) -> None:
    """0 quiet; 1 one line per step (node command, compiler run, API request, file read) with its time;
    2 whole commands too."""
    global _level
    _level = level
    if level and not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("vgpu-patch: debug: %(relativeCreated)7.0f ms %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.DEBUG if level else logging.WARNING)


def level() -> int:
    return _level


def describe(cmd: str) -> str:
    """A command as -v shows it: its first line and size, or (with -vv) all of it."""
    if _level >= 2:
        return "\n" + cmd
    lines = [ln for ln in cmd.splitlines() if ln.strip()]
    head = lines[0].strip()[:100] if lines else ""
    return head if len(lines) <= 1 else f"{head} ... ({len(lines)} lines, {len(cmd)} bytes; -vv shows all)"


@contextlib.contextmanager
def step(subject: str, what: str, detail: str = "") -> Iterator[None]:
    """With -v: `subject: what: detail` when a step starts, and when it ends, with its time."""
    if not log.isEnabledFor(logging.DEBUG):
        yield
        return
    log.debug("%s: %s%s", subject, what, f": {detail}" if detail else "")
    t0 = time.monotonic()
    try:
        yield
    except BaseException:
        log.debug("%s: %s failed in %.3f s", subject, what, time.monotonic() - t0)
        raise
    log.debug("%s: %s done in %.3f s", subject, what, time.monotonic() - t0)
