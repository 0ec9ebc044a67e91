"""The transport interface every deploy operation is written against (local and SSH alike).

A node needs only POSIX sh and coreutils: every operation is a shell script run through `run`.
Privileged steps use `sudo=True`: the transport runs them as root (directly when already root,
else `sudo -n sh -c`), and a refused sudo raises `AuthFailure`, never a plain command failure.
"""
from __future__ import annotations

import logging
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..report import verbosity
from ..report.errors import AuthFailure, DeployError

# -v/--debug: what runs on each node, and how long it took, on stderr (never on stdout: --json stays clean)
log = logging.getLogger("vgpu_patch.node")
set_verbosity = verbosity.set_level  # the names this module has always offered
describe = verbosity.describe


class Timed:
    """With -v: one line when a node step starts (`run (sudo): <command>`), one when it ends, with its time.

    `with Timed(node, "run", cmd) as t: ... t.end("exit 0")`; leaving the block by an error logs it as failed.
    """

    def __init__(self, node: str, what: str, detail: str = "") -> None:
        self.node, self.what, self.t0, self.ended = node, what, time.monotonic(), False
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s: %s", node, what, detail)

    def end(self, outcome: str = "done") -> None:
        if not self.ended and log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s %s in %.3f s", self.node, self.what, outcome, time.monotonic() - self.t0)
        self.ended = True

    def __enter__(self) -> Timed:
        return self

    def __exit__(self, kind: object, exc: object, _tb: object) -> None:
        self.end(f"failed: {str(exc).splitlines()[0][:160] if str(exc) else kind}" if kind else "done")


# Printed by the privileged shell as its first act: its absence means sudo itself refused.
SUDO_MARKER = "__vgpu_patch_sudo_ok__"
SUDO_PROMPT = "[vgpu-patch sudo] password: "


@dataclass
class Result:
    ok: bool
    exited: int
    stdout: str
    stderr: str
    command: str = ""


def first_line(text: str, limit: int = 200) -> str:
    """The first non-empty line of `text`, shortened: error messages stay on one line."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def sudo_wrap(cmd: str, *, password: bool = False, stdin: bool = False) -> str:
    """`cmd` run by root through `sudo sh -c`, printing SUDO_MARKER first on stdout.

    Without a password sudo must not ask (`-n`); with one it asks at SUDO_PROMPT, on the terminal,
    or reading stdin (`-S`) when there is no terminal.
    """
    inner = f"printf '%s\\n' {SUDO_MARKER}; {cmd}"
    mode = ("-S " if stdin else "") if password else "-n "
    return f"sudo {mode}-p {shlex.quote(SUDO_PROMPT)} sh -c {shlex.quote(inner)}"


def sudo_unwrap(node: str, result: Result) -> Result:
    """Strip the sudo marker; without it, sudo refused: raise AuthFailure with sudo's own words."""
    out = result.stdout
    idx = out.find(SUDO_MARKER)
    if idx < 0:
        why = first_line(result.stderr) or first_line(out) or f"exit {result.exited}"
        if "password is required" in why or SUDO_PROMPT.strip() in out + result.stderr:
            raise AuthFailure(f"{node}: sudo refused ({why}); if this user may sudo with a password, rerun with "
                              f"--ask-become-pass, else allow it passwordless sudo for /bin/sh or log in as root")
        raise AuthFailure(
            f"{node}: sudo refused ({why}); allow this user passwordless sudo for /bin/sh or log in as root"
        )
    before, after = out[:idx].replace(SUDO_PROMPT.strip(), ""), out[idx + len(SUDO_MARKER) :]
    result.stdout = before + after.lstrip("\r\n") if before.strip() else after.lstrip("\r\n")
    return result


class Stream:
    """One shell on the node whose stdin stays open: what it prints is read up to a marker, more input is
    sent after that (a deploy's probe, then its decision, script and payload: one session, one sudo).

    Built by a transport from four byte-level callables; `finish()` closes stdin, reads to the end and
    returns the Result of everything printed after the last `read_until`.
    """

    def __init__(self, name: str, *, recv: Callable[[int], bytes], send: Callable[[bytes], None],
                 close_input: Callable[[], None], wait: Callable[[], tuple[int, str]], wrapped: bool,
                 command: str) -> None:
        self.name, self.command, self.wrapped = name, command, wrapped
        self._recv, self._send, self._close_input, self._wait = recv, send, close_input, wait
        self._buf = bytearray()
        self._sudo_seen = not wrapped
        self.scanned = 0  # bytes read_until searched: stays near the output's size (tests check it)

    def read_until(self, marker: str) -> str:
        """What the node prints up to and including the line `marker`; the script ending first is an error."""
        want = ("\n" + marker + "\n").encode()
        start = 0  # each byte is searched about once, however long the output (a 100,000-line history)
        while True:
            if self._buf.startswith(want[1:]):  # the marker's line may be the very first
                end = len(want) - 1
                break
            found = self._buf.find(want, start)
            self.scanned += len(self._buf) - start
            if found >= 0:
                end = found + len(want)
                break
            start = max(0, len(self._buf) - len(want) + 1)  # a marker cut between two reads is still found
            data = self._recv(1 << 15)
            if not data:
                res = self.finish()  # sudo refused (AuthFailure), or the script failed early
                raise DeployError(f"{self.name}: the node script ended early with exit {res.exited}: "
                                  f"{first_line(res.stderr) or first_line(res.stdout)}")
            self._buf += data
        head, self._buf = bytes(self._buf[:end]), self._buf[end:]
        return self._unwrap(head.decode(errors="replace"))

    def send(self, data: bytes) -> None:
        self._send(data)

    def finish(self) -> Result:
        """Close the node's stdin, read what is left, wait for the exit status."""
        self._close_input()
        while True:
            data = self._recv(1 << 15)
            if not data:
                break
            self._buf += data
        code, err = self._wait()
        out, self._buf = bytes(self._buf).decode(errors="replace"), bytearray()
        result = Result(code == 0, code, out, err, self.command)
        if not self._sudo_seen:
            result = sudo_unwrap(self.name, result)  # raises AuthFailure when sudo refused
            self._sudo_seen = True
        return result

    def _unwrap(self, text: str) -> str:
        if self._sudo_seen:
            return text
        self._sudo_seen = True
        return sudo_unwrap(self.name, Result(True, 0, text, "")).stdout


class Transport(ABC):
    """Commands and files on one node. Paths given to it are node paths."""

    #: how the node is named in messages and results
    name: str = "node"
    #: --command-timeout: replaces every command's own limit when set
    command_timeout: float | None = None

    def limit(self, timeout: float | None) -> float | None:
        """The time limit a command gets: --command-timeout when given, else the caller's."""
        return self.command_timeout if self.command_timeout is not None else timeout

    @abstractmethod
    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None) -> Result:
        """Run `cmd` with sh; raise DeployError on a non-zero exit unless `warn` (then return the failed Result)."""

    @abstractmethod
    def put(self, local_path: Path | str, remote_path: str) -> None:
        """Copy a local file to a new node path (created exclusively: an existing file is an error)."""

    @abstractmethod
    def get(self, remote_path: str, local_path: Path | str) -> None:
        """Copy a node file to a local path."""

    def open_stream(self, cmd: str, *, sudo: bool = False, timeout: float | None = None) -> Stream | None:
        """`cmd` run with its stdin kept open (see Stream); None where this transport cannot (then the
        caller runs its steps with `run` and `put` instead)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional: a transport without connections has nothing to release
        """Release connections; the transport may be used again (it reconnects)."""

    def path(self, node_path: str) -> str:
        """Where a node path really lives for commands run by this transport (a fake root maps it)."""
        return node_path

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, result: Result, warn: bool) -> Result:
        if not result.ok and not warn:
            why = first_line(result.stderr) or first_line(result.stdout)
            raise DeployError(f"{self.name}: command failed with exit {result.exited}: {why}")
        return result
