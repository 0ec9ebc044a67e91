"""Run commands and copy files on a node: one interface (base.Transport), a local and an SSH backend."""
from __future__ import annotations

from .base import Result, Transport

__all__ = ["Result", "Transport"]
