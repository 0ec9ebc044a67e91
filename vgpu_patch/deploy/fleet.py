"""Run one operation over many nodes: bounded parallelism, canaries first, stop on first failure.

Every node gets an outcome (changed, unchanged, pending, ok, failed or skipped); nothing is hidden,
and the caller decides the exit status from the whole picture (`exit_code`).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, FleetError, VgpuPatchError
from ..transport.base import Transport
from .targets import HostSpec


@dataclass
class NodeOutcome:
    node: str
    status: str  # changed | unchanged | pending | ok | failed | skipped
    result: object = None  # SwapResult or NodeStatus
    error: str | None = None
    error_type: str | None = None
    seconds: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.status in ("changed", "unchanged", "pending", "ok")

    def to_dict(self) -> dict:
        res = self.result.to_dict() if hasattr(self.result, "to_dict") else None
        return {"node": self.node, "status": self.status, "error": self.error, "error_type": self.error_type,
                "seconds": round(self.seconds, 3), "result": res}


@dataclass
class FleetResult:
    outcomes: list[NodeOutcome] = field(default_factory=list)

    @property
    def succeeded(self) -> list[NodeOutcome]:
        return [o for o in self.outcomes if o.succeeded]

    @property
    def failed(self) -> list[NodeOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def skipped(self) -> list[NodeOutcome]:
        return [o for o in self.outcomes if o.status == "skipped"]

    def exit_code(self, *, dry_run: bool = False) -> int:
        """0 every node reached (or already had) the wanted state; 3 some did; 1 none did.

        With --dry-run, 1 also when every node answered but changes are pending (like pip-sync).
        """
        ok = self.succeeded
        if len(ok) == len(self.outcomes):
            if dry_run and any(o.status == "pending" for o in ok):
                return EXIT_FAILED
            return EXIT_OK
        return EXIT_PARTIAL if ok else EXIT_FAILED

    def raise_for_failures(self) -> None:
        """For library callers: one FleetError carrying every node's outcome when any node failed or was skipped."""
        bad = self.failed + self.skipped
        if bad:
            first = self.failed[0].error if self.failed else "skipped"
            raise FleetError(
                f"{len(bad)} of {len(self.outcomes)} node(s) not done; first failure: {first}",
                {o.node: o for o in self.outcomes},
            )

    def to_dict(self) -> dict:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        return {"nodes": [o.to_dict() for o in self.outcomes], "counts": counts}


Op = Callable[[Transport, HostSpec], "tuple[str, object]"]


def run_fleet(
    specs: Sequence[HostSpec],
    op: Op,
    connect: Callable[[HostSpec], Transport],
    *,
    parallel: int = 10,
    canary: int | None = None,
    keep_going: bool = False,
    on_done: Callable[[NodeOutcome], None] | None = None,
) -> FleetResult:
    """Apply `op` (returns (status, result)) to every node; canaries first, then the rest in parallel."""
    if canary is None:
        canary = 1 if len(specs) > 1 else 0
    canary = max(0, min(canary, len(specs)))
    stop = threading.Event()
    outcomes: dict[int, NodeOutcome] = {}

    def one(i: int) -> None:
        spec = specs[i]
        if stop.is_set():
            outcomes[i] = NodeOutcome(spec.name, "skipped", error="not attempted: an earlier node failed")
        else:
            start = time.monotonic()
            t = None
            try:
                t = connect(spec)
                status, result = op(t, spec)
                outcomes[i] = NodeOutcome(spec.name, status, result, seconds=time.monotonic() - start)
            except Exception as e:  # one node's failure must never hide the others' results
                msg = str(e) if isinstance(e, VgpuPatchError) else f"{spec.name}: {type(e).__name__}: {e}"
                outcomes[i] = NodeOutcome(spec.name, "failed", error=msg, error_type=type(e).__name__,
                                          seconds=time.monotonic() - start)
                if not keep_going:
                    stop.set()
            finally:
                if t is not None:
                    t.close()
        if on_done:
            on_done(outcomes[i])

    workers = max(1, parallel)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, range(canary)))
        list(pool.map(one, range(canary, len(specs))))
    return FleetResult([outcomes[i] for i in range(len(specs))])
