"""Run one operation over many nodes: batches (Ansible's `serial`), a failure budget (Ansible's
`max_fail_percentage`, or an absolute count), pauses between batches, bounded parallelism.

When the budget is spent, nodes not yet started are skipped and nodes in flight stop at their next
checkpoint (`stop_requested()`, which deploy/rollback consult before touching the node): only nodes
whose swap had already begun complete. Every node gets an outcome (changed, unchanged, pending, ok,
failed or skipped); nothing is hidden, and the caller decides the exit status (`exit_code`).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from ..report.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, FleetError, StopRequested, UsageError, VgpuPatchError
from ..transport.base import Transport
from .targets import HostSpec

R = TypeVar("R")  # what the operation returns for one node: a SwapResult (deploy, rollback), a NodeStatus (status)


@dataclass
class NodeOutcome(Generic[R]):
    node: str
    status: str  # changed | unchanged | pending | ok | failed | skipped
    result: R | None = None  # None when the node failed or was skipped
    error: str | None = None
    error_type: str | None = None
    seconds: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.status in ("changed", "unchanged", "pending", "ok")

    def to_dict(self) -> dict:
        res = self.result.to_dict() if self.result is not None and hasattr(self.result, "to_dict") else None
        return {"node": self.node, "status": self.status, "error": self.error, "error_type": self.error_type,
                "seconds": round(self.seconds, 3), "result": res}


@dataclass
class FleetResult(Generic[R]):
    outcomes: list[NodeOutcome[R]] = field(default_factory=list)

    @property
    def succeeded(self) -> list[NodeOutcome[R]]:
        return [o for o in self.outcomes if o.succeeded]

    @property
    def failed(self) -> list[NodeOutcome[R]]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def skipped(self) -> list[NodeOutcome[R]]:
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


Op = Callable[[Transport, HostSpec], "tuple[str, R]"]

_current = threading.local()


def stop_requested() -> bool:
    """In a fleet worker: whether the run is stopping (the failure budget is spent); False elsewhere."""
    ev = getattr(_current, "stop", None)
    return bool(ev is not None and ev.is_set())


@dataclass(frozen=True)
class Policy:
    """How a rollout proceeds: batch sizes (ints or "N%", the last repeats), failure budget, pause."""

    batches: tuple[str, ...] = ("100%",)
    max_fail: str = "0"  # "N" (in all) or "N%" (of a batch); "" = unlimited
    pause_between: float = 0.0

    @classmethod
    def from_options(cls, *, n: int, batch: str | None, canary: int | None, max_fail: str | None,
                     keep_going: bool, pause_between: float = 0.0) -> Policy:
        if batch:
            sizes = tuple(x.strip() for x in batch.split(",") if x.strip())
            for x in sizes:
                _size(x, 1, "--batch")
            if not sizes:
                raise UsageError(f"--batch {batch!r}: give sizes like 1,10%,50%")
        else:
            c = (1 if n > 1 else 0) if canary is None else canary
            sizes = (str(c), "100%") if 0 < c < n else ("100%",)
        budget = "" if keep_going else (max_fail.strip() if max_fail else "0")
        if budget:
            _size(budget, 1, "--max-fail", zero_ok=True)
        return cls(sizes, budget, pause_between)

    def plan(self, n: int) -> list[range]:
        """Ansible's serial: each size (a % of all nodes, rounded down, at least 1); the last repeats."""
        out, start, i = [], 0, 0
        while start < n:
            size = _size(self.batches[min(i, len(self.batches) - 1)], n, "--batch")
            out.append(range(start, min(n, start + size)))
            start += size
            i += 1
        return out

    def exceeded(self, failed_total: int, failed_batch: int, batch_size: int, *, batch_done: bool) -> bool:
        if not self.max_fail:
            return False
        if self.max_fail.endswith("%"):  # judged when the batch is done, like max_fail_percentage
            if not batch_done or batch_size == 0:
                return False
            return failed_batch == batch_size or failed_batch * 100 > float(self.max_fail[:-1]) * batch_size
        return failed_total > int(self.max_fail)


def _size(text: str, n: int, opt: str, *, zero_ok: bool = False) -> int:
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return max(1, int(n * pct / 100)) if not zero_ok else int(pct)
        v = int(text)
        if v < (0 if zero_ok else 1):
            raise ValueError
        return v
    except ValueError:
        raise UsageError(f"{opt} {text!r}: expected a whole number N or a percentage N% (0-100)") from None


def run_fleet(
    specs: Sequence[HostSpec],
    op: Op[R],
    connect: Callable[[HostSpec], Transport],
    *,
    parallel: int = 10,
    canary: int | None = None,
    keep_going: bool = False,
    on_done: Callable[[NodeOutcome[R]], None] | None = None,
    policy: Policy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> FleetResult[R]:
    """Apply `op` (returns (status, result)) to every node, batch after batch (see the module docstring)."""
    policy = policy or Policy.from_options(n=len(specs), batch=None, canary=canary, max_fail=None,
                                           keep_going=keep_going)
    stop = threading.Event()
    outcomes: dict[int, NodeOutcome[R]] = {}
    lock = threading.Lock()
    failed = {"total": 0, "batch": 0}
    batches = policy.plan(len(specs))

    def one(i: int, size: int) -> None:
        spec = specs[i]
        if stop.is_set():
            outcomes[i] = NodeOutcome(spec.name, "skipped", error="not attempted: the failure budget was spent")
        else:
            _current.stop = stop
            start = time.monotonic()
            t = None
            try:
                t = connect(spec)
                status, result = op(t, spec)
                outcomes[i] = NodeOutcome(spec.name, status, result, seconds=time.monotonic() - start)
            except StopRequested as e:
                outcomes[i] = NodeOutcome(spec.name, "skipped", error=str(e), error_type=type(e).__name__,
                                          seconds=time.monotonic() - start)
            except Exception as e:  # one node's failure must never hide the others' results
                msg = str(e) if isinstance(e, VgpuPatchError) else f"{spec.name}: {type(e).__name__}: {e}"
                outcomes[i] = NodeOutcome(spec.name, "failed", error=msg, error_type=type(e).__name__,
                                          seconds=time.monotonic() - start)
                with lock:
                    failed["total"] += 1
                    failed["batch"] += 1
                    if policy.exceeded(failed["total"], failed["batch"], size, batch_done=False):
                        stop.set()
            finally:
                _current.stop = None
                if t is not None:
                    t.close()
        if on_done:
            on_done(outcomes[i])

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for k, batch in enumerate(batches):
            failed["batch"] = 0
            size = len(batch)
            list(pool.map(lambda i: one(i, size), batch))  # noqa: B023 - used before the loop moves on
            if not stop.is_set() and policy.exceeded(failed["total"], failed["batch"], len(batch), batch_done=True):
                stop.set()
            if stop.is_set() or k == len(batches) - 1:
                continue
            if policy.pause_between:
                sleep(policy.pause_between)
    return FleetResult([outcomes[i] for i in range(len(specs))])
