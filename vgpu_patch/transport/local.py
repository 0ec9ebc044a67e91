"""Run the deploy protocol on this machine, optionally under a fake node root (README demo, tests, agent)."""
from __future__ import annotations

import contextlib
import os
import select
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from ..report.errors import DeployError, UsageError
from .base import Result, Stream, Timed, Transport, describe, sudo_unwrap, sudo_wrap

_MAX_LINKS = 40  # like the kernel's ELOOP limit


def resolve_in_root(root: Path | str, node_path: str) -> str:
    """Where `node_path` of a node whose `/` is `root` really is, resolved as if chrooted there.

    Symlinks are followed component by component with `root` as `/`: an absolute target is re-rooted
    under `root`, and `..` stops at `root`. The answer is always inside `root`, never outside it
    (`--local ROOT` and the agent's `--host-root`). The last component may be missing.
    """
    base = os.path.realpath(str(root))
    if base == "/":
        return os.path.normpath("/" + node_path.lstrip("/"))
    todo = [p for p in node_path.split("/") if p]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        real = os.path.join(base, *done, part)
        try:
            st = os.lstat(real)
        except OSError:
            done.append(part)
            continue
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise UsageError(f"{node_path}: too many levels of symlinks under {base}")
            target = os.readlink(real)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        done.append(part)
    return os.path.join(base, *done) if done else base


class LocalTransport(Transport):
    """Commands via `sh -c` here; absolute node paths map under `root` (default `/`, the real system).

    Only file paths the deploy code passes through `path()` are mapped (confined by resolve_in_root):
    scripts see the real location. sudo is used only when managing the real system (`root` is `/`) as a
    non-root user.
    """

    def __init__(self, root: Path | str | None = None, name: str | None = None) -> None:
        self.root = Path(root or "/").resolve()
        self.name = name or ("local" if str(self.root) == "/" else f"local:{self.root}")

    def path(self, node_path: str) -> str:
        if str(self.root) == "/":
            return node_path
        return resolve_in_root(self.root, node_path)

    def _needs_sudo(self, sudo: bool) -> bool:
        return sudo and os.geteuid() != 0 and str(self.root) == "/"

    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None) -> Result:
        timeout = self.limit(timeout)
        with Timed(self.name, "run (sudo)" if sudo else "run", describe(cmd)) as t:
            result = self._run(cmd, sudo=sudo, warn=warn, timeout=timeout)
            t.end(f"exit {result.exited}")
            return result

    def _run(self, cmd: str, *, sudo: bool, warn: bool, timeout: float | None) -> Result:
        wrapped = self._needs_sudo(sudo)
        full = sudo_wrap(cmd) if wrapped else cmd
        try:
            proc = subprocess.run(["sh", "-c", full], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise DeployError(f"{self.name}: command timed out after {timeout}s: {cmd.splitlines()[0][:80]}") from e
        # node files may hold any bytes (a damaged history line): decode like the SSH transport, never crash
        out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        result = Result(proc.returncode == 0, proc.returncode, out, err, cmd)
        if wrapped:
            result = sudo_unwrap(self.name, result)
        return self._check(result, warn)

    def open_stream(self, cmd: str, *, sudo: bool = False, timeout: float | None = None) -> Stream | None:
        wrapped = self._needs_sudo(sudo)
        timeout = self.limit(timeout)
        timed = Timed(self.name, "session (sudo)" if sudo else "session", describe(cmd))
        err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in wait(); a file, not a pipe: stderr never blocks
        proc = subprocess.Popen(["sh", "-c", sudo_wrap(cmd) if wrapped else cmd], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        poller = select.poll()  # not select(): a busy agent may hold descriptors numbered above 1024
        poller.register(stdout, select.POLLIN)

        def recv(n: int) -> bytes:
            if not poller.poll(None if timeout is None else timeout * 1000):
                proc.kill()
                raise DeployError(f"{self.name}: the node script did not answer within {timeout}s")
            return os.read(stdout.fileno(), n)

        def send(data: bytes) -> None:
            try:
                stdin.write(data)
                stdin.flush()
            except BrokenPipeError as e:
                raise DeployError(f"{self.name}: the node script stopped reading its input") from e

        def close_input() -> None:
            if not stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    stdin.close()

        def wait() -> tuple[int, str]:
            code = proc.wait()
            timed.end(f"exit {code}")
            stdout.close()
            err.seek(0)
            text = err.read().decode(errors="replace")
            err.close()
            return code, text

        return Stream(self.name, recv=recv, send=send, close_input=close_input, wait=wait, wrapped=wrapped,
                      command=cmd)

    def put(self, local_path: Path | str, remote_path: str) -> None:
        dest = Path(self.path(remote_path))
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            # new, private, and never through a planted symlink
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                with open(local_path, "rb") as src, os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            except BaseException:
                dest.unlink(missing_ok=True)
                raise
        except OSError as e:
            raise DeployError(f"{self.name}: upload to {remote_path} failed: {e.strerror or e}") from e

    def get(self, remote_path: str, local_path: Path | str) -> None:
        try:
            fd = os.open(self.path(remote_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as src, open(local_path, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except OSError as e:
            raise DeployError(f"{self.name}: download of {remote_path} failed: {e.strerror or e}") from e
