"""Helpers for the agent tests: a temporary host root and tiny real shared objects built with gcc."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
