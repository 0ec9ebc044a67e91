"""Preflight step: `vgpu-patch check` of the candidate against the file live on the node.

When the live file is the vendor's, it is fetched and used as the reference (same surface, same
floor); when it is ours, the bundled reference surface is used. Results are cached per live sha256,
so a fleet of identical nodes downloads and checks once.
"""
from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from ..report.errors import DeployError, VgpuPatchError
from ..transport.base import Transport
from .candidate import Candidate
from .facts import LibFile


class CompatCache:
    """Thread-safe memo of check verdicts: key -> None (passed) or the one-line failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._verdicts: dict[str, str | None] = {}

    def lock_for(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get(self, key: str) -> tuple[bool, str | None]:
        return (key in self._verdicts, self._verdicts.get(key))

    def put(self, key: str, verdict: str | None) -> None:
        self._verdicts[key] = verdict


_DEFAULT_CACHE = CompatCache()


def check_against_live(t: Transport, cand: Candidate, live: LibFile | None, cache: CompatCache | None = None) -> str:
    """Raise DeployError when the check finds a blocking problem; return what was compared, in words."""
    try:
        from ..elf.check import check_file
    except ImportError:
        return "vgpu-patch check not available in this install: skipped"
    cache = cache or _DEFAULT_CACHE
    vendor = live is not None and not live.ours_version
    key = f"{cand.sha256}:{live.sha256 if vendor else 'reference'}"  # type: ignore[union-attr]
    what = f"the live vendor file {live.path}" if vendor else "the reference surface"  # type: ignore[union-attr]
    with cache.lock_for(key):
        known, verdict = cache.get(key)
        if not known:
            verdict = _run_check(t, cand, live if vendor else None, check_file)
            cache.put(key, verdict)
    if verdict:
        raise DeployError(f"{t.name}: {verdict}; live file untouched (or rerun with --no-check)")
    return f"vgpu-patch check against {what}: passed"


def _run_check(t: Transport, cand: Candidate, vendor_live: LibFile | None,
               check_file: Callable[..., Any]) -> str | None:
    with tempfile.TemporaryDirectory(prefix="vgpu-patch-check-") as tmp:
        vendor_copy = None
        if vendor_live is not None:
            vendor_copy = Path(tmp) / vendor_live.name
            t.get(vendor_live.path, vendor_copy)
        try:
            report = check_file(cand.path, vendor=vendor_copy)
        except VgpuPatchError as e:
            return f"vgpu-patch check could not compare {cand.path.name}: {e}"
    if report.ok:
        return None
    failed = report.failed()
    return (f"vgpu-patch check found {len(failed)} blocking problem(s) in {cand.path.name} against "
            f"{'the live vendor file' if vendor_live else 'the reference surface'}: {', '.join(failed[:5])}; "
            f"run `vgpu-patch check {cand.path.name}` for details")
