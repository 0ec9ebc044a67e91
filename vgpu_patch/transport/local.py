"""Run the deploy protocol on this machine, optionally under a fake node root (README demo, tests, agent)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import DeployError
from .base import Result, Transport, sudo_unwrap, sudo_wrap


class LocalTransport(Transport):
    """Commands via `sh -c` here; absolute node paths map under `root` (default `/`, the real system).

    Only file paths the deploy code passes through `path()` are mapped: scripts see the real location.
    sudo is used only when managing the real system (`root` is `/`) as a non-root user.
    """

    def __init__(self, root: Path | str | None = None, name: str | None = None) -> None:
        self.root = Path(root or "/").resolve()
        self.name = name or ("local" if str(self.root) == "/" else f"local:{self.root}")

    def path(self, node_path: str) -> str:
        if str(self.root) == "/":
            return node_path
        return str(self.root / node_path.lstrip("/"))

    def _needs_sudo(self, sudo: bool) -> bool:
        return sudo and os.geteuid() != 0 and str(self.root) == "/"

    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None) -> Result:
        wrapped = self._needs_sudo(sudo)
        full = sudo_wrap(cmd) if wrapped else cmd
        try:
            proc = subprocess.run(
                ["sh", "-c", full], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as e:
            raise DeployError(f"{self.name}: command timed out after {timeout}s: {cmd.splitlines()[0][:80]}") from e
        result = Result(proc.returncode == 0, proc.returncode, proc.stdout, proc.stderr, cmd)
        if wrapped:
            result = sudo_unwrap(self.name, result)
        return self._check(result, warn)

    def put(self, local_path: Path | str, remote_path: str) -> None:
        dest = Path(self.path(remote_path))
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(local_path, "rb") as src, open(dest, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except OSError as e:
            raise DeployError(f"{self.name}: upload to {remote_path} failed: {e.strerror or e}") from e

    def get(self, remote_path: str, local_path: Path | str) -> None:
        try:
            shutil.copyfile(self.path(remote_path), local_path)
        except OSError as e:
            raise DeployError(f"{self.name}: download of {remote_path} failed: {e.strerror or e}") from e
