"""Helpers for the agent tests: a temporary host root and tiny real shared objects built with gcc."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from node_fixtures import NodeRoot, build_marked_lib, sha  # noqa: F401  (sha: re-exported for the tests)


@dataclass
class Image:
    """What the DaemonSet image carries: the library and its build manifest."""

    library: Path
    sha256: str


class Host(NodeRoot):
    """The host filesystem the agent's hostPath mount shows it."""


def build_lib(d: Path, name: str, marker: str, version: int) -> Path:
    return build_marked_lib(d / name, marker, version)


TIMEOUT = 30.0  # generous: a loaded CI machine; waits end as soon as the condition holds


def wait_for(cond: Callable[[], bool], timeout: float = TIMEOUT) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - start


def hami_copy_back(src: Path, live: Path) -> None:
    """What HAMi's device plugin does on restart: a plain in-place cp over the live file."""
    with open(src, "rb") as f, open(live, "r+b") as out:
        out.truncate(0)
        shutil.copyfileobj(f, out)
