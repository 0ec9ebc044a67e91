"""A writer of a candidate's directory who renames another file into place between this process's reads.

`ReadSwapper` hooks every way Python opens a file (builtins.open, io.open, os.open) in the test's process. Each
open of the watched path is one read position; before it happens, the swapper renames the file its plan names
for that position into place (a new file, renamed over the path, as an attacker with write access to the
directory would). A unique module name at tests/ (which pytest puts on sys.path), so every folder can use it.
"""
from __future__ import annotations

import builtins
import io
import os
from pathlib import Path
from typing import Any

import pytest

_real_open, _real_os_open, _real_replace = builtins.open, os.open, os.replace


class ReadSwapper:
    """Counts the opens of `path`; with a plan, puts `files[plan(i)]` at `path` before open number i."""

    def __init__(self, path: Path, files: dict[str, bytes]) -> None:
        self.path, self.files = str(path), files
        self.reads = 0
        self.shown: list[str] = []  # which file each read saw
        self.plan: Any = None  # callable(i) -> a key of files, or None: leave the path alone

    def install(self, monkeypatch: pytest.MonkeyPatch) -> ReadSwapper:
        def hooked_open(file: Any, *args: Any, **kw: Any) -> Any:
            self._before(file)
            return _real_open(file, *args, **kw)

        def hooked_os_open(file: Any, *args: Any, **kw: Any) -> int:
            self._before(file)
            return _real_os_open(file, *args, **kw)

        monkeypatch.setattr(builtins, "open", hooked_open)
        monkeypatch.setattr(io, "open", hooked_open)
        monkeypatch.setattr(os, "open", hooked_os_open)
        return self

    def put(self, key: str) -> None:
        """Rename a fresh copy of files[key] over the path (never written in place)."""
        tmp = self.path + ".swap-tmp"
        fd = _real_os_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with _real_open(fd, "wb") as f:
            f.write(self.files[key])
        _real_replace(tmp, self.path)

    def _before(self, file: Any) -> None:
        if isinstance(file, int) or os.fspath(file) != self.path:
            return
        if self.plan is not None:
            key = self.plan(self.reads)
            if key is not None:
                self.put(key)
                self.shown.append(key)
        self.reads += 1


def patterns(reads: int, good: str, bad: str) -> list[tuple[str, Any]]:
    """Every way one read can differ from all others: `good` at read k only, and `bad` at read k only."""
    out: list[tuple[str, Any]] = []
    for k in range(reads):
        out.append((f"{good} only at read {k}", lambda i, k=k: good if i == k else bad))
        out.append((f"{bad} only at read {k}", lambda i, k=k: bad if i == k else good))
    return out
