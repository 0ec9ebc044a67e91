"""Processes that still map an old copy of the library, and the pods they belong to.

After a swap, running containers keep the inode they bind-mounted until they restart. A process is
stale when one of its mappings of the library (the host path under the library directory, or HAMi's
in-container `/usr/local/vgpu/libvgpu.so`) is a deleted file or an inode other than the live file's.
`scan()` reads /proc directly (the agent, with hostPID or the host's /proc mounted); `pods_for_pids()`
reads the cgroup files of given pids over any transport (`vgpu-patch status`).
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..deploy.fleet import FleetResult
from ..deploy.swap import NodeStatus
from ..transport.base import Transport
from .cgroup import PodRef, parse_cgroup

CONTAINER_LIB = "/usr/local/vgpu/libvgpu.so"  # where HAMi mounts the chosen file in every container
LIB = "libvgpu.so"
_NEEDLE = LIB.encode()


@dataclass
class StaleProcess:
    pid: int
    inode: int
    path: str
    deleted: bool
    pod: PodRef | None = None

    def to_dict(self) -> dict:
        return {"pid": self.pid, "inode": self.inode, "path": self.path, "deleted": self.deleted,
                **(self.pod.to_dict() if self.pod else {"pod_uid": None, "container_id": None})}


@dataclass
class StalePod:
    """One pod's stale processes; namespace and name are filled in from the API when the agent can read it."""

    pod_uid: str
    containers: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    namespace: str | None = None
    name: str | None = None

    def to_dict(self) -> dict:
        return {"pod_uid": self.pod_uid, "namespace": self.namespace, "name": self.name,
                "containers": self.containers, "pids": self.pids}


def _lib_match(path: str, lib_dirs: tuple[str, ...]) -> bool:
    path = path.removesuffix(" (deleted)")
    if path == CONTAINER_LIB:
        return True
    head, _, base = path.rpartition("/")
    return head in lib_dirs and (base == LIB or base.startswith(LIB + "."))


def parse_maps_line(line: str) -> tuple[int, str, bool] | None:
    """(inode, path, deleted) of one /proc/PID/maps line that maps a file, else None."""
    cols = line.split(None, 5)
    if len(cols) < 6 or not cols[5].startswith("/"):
        return None
    path = cols[5].rstrip("\n")
    deleted = path.endswith(" (deleted)")
    try:
        return int(cols[4]), path.removesuffix(" (deleted)"), deleted
    except ValueError:
        return None


def scan(proc: Path | str, lib_dirs: Iterable[str], live_inode: int | None, *,
         skip_pid: int | None = None) -> list[StaleProcess]:
    """Every process under `proc` mapping a library copy other than the live inode, with its pod when in one.

    `lib_dirs` are the library directory as processes see it: the host path, and the path under the agent's
    host root where the agent itself reads it (so a test's fake root works the same).
    """
    proc = Path(proc)
    dirs = tuple(d.rstrip("/") for d in lib_dirs)
    out: list[StaleProcess] = []
    try:
        entries = [e for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return out
    own = skip_pid if skip_pid is not None else os.getpid()
    for e in entries:
        pid = int(e.name)
        if pid == own:
            continue
        try:
            with open(os.path.join(e.path, "maps"), "rb") as f:
                data = f.read()
        except OSError:  # exited, or not readable (no CAP_SYS_PTRACE for another user's process)
            continue
        if _NEEDLE not in data:  # nearly every process: one C-level search, no line parsing
            continue
        lines = [ln for ln in data.decode(errors="replace").splitlines() if LIB in ln]
        hits = [m for line in lines if (m := parse_maps_line(line)) and _lib_match(m[1], dirs)]
        stale = [m for m in hits if m[2] or m[0] != live_inode]
        if not stale:
            continue
        inode, path, deleted = stale[0]
        try:
            pod = parse_cgroup(Path(e.path, "cgroup").read_text(errors="replace"))
        except OSError:
            pod = None
        out.append(StaleProcess(pid, inode, path, deleted, pod))
    return sorted(out, key=lambda s: s.pid)


INIT_PID_NS = "pid:[4026531836]"  # the kernel's initial PID namespace (PROC_PID_INIT_INO)


def scope(proc: Path | str) -> str:
    """Which processes `proc` shows: `host` (the initial PID namespace: hostPID or the host's /proc),
    `pid-namespace` (only this pod's), or `unknown` (not a procfs we can tell, e.g. a test's fake /proc)."""
    try:
        ns = os.readlink(os.path.join(proc, "1", "ns", "pid"))
    except OSError:
        try:
            ns = os.readlink(os.path.join(proc, "self", "ns", "pid"))
        except OSError:
            return "unknown"
    return "host" if ns == INIT_PID_NS else "pid-namespace"


def by_pod(procs: Iterable[StaleProcess]) -> tuple[list[StalePod], list[int]]:
    """Group by pod: the pods (sorted by uid) and the pids that belong to no pod (host processes)."""
    pods: dict[str, StalePod] = {}
    other: list[int] = []
    for p in procs:
        if p.pod is None:
            other.append(p.pid)
            continue
        sp = pods.setdefault(p.pod.pod_uid, StalePod(p.pod.pod_uid))
        sp.pids.append(p.pid)
        if p.pod.container_id and p.pod.container_id not in sp.containers:
            sp.containers.append(p.pod.container_id)
    return [pods[k] for k in sorted(pods)], sorted(other)


def pods_for_pids(t: Transport, pids: Iterable[int]) -> dict[int, PodRef | None]:
    """Read /proc/PID/cgroup of each pid on the node in one round trip; a pid that exited maps to None."""
    pids = sorted({int(p) for p in pids})
    if not pids:
        return {}
    script = "for p in " + " ".join(shlex.quote(str(p)) for p in pids) + \
        "; do printf '@@pid %s\\n' \"$p\"; cat /proc/\"$p\"/cgroup 2>/dev/null; done; true"
    res = t.run(script, sudo=True, warn=True, timeout=60)
    out: dict[int, PodRef | None] = dict.fromkeys(pids)
    cur: int | None = None
    chunks: dict[int, list[str]] = {}
    for line in res.stdout.splitlines():
        if line.startswith("@@pid "):
            cur = int(line[6:].strip())
            chunks[cur] = []
        elif cur is not None:
            chunks[cur].append(line)
    for pid, lines in chunks.items():
        out[pid] = parse_cgroup("\n".join(lines))
    return out


@dataclass
class NodeStatusWithPods(NodeStatus):
    """`vgpu-patch status` for one node, plus each stale process's pod (`stale_processes`)."""

    stale_processes: list[dict] = field(default_factory=list)


def with_pods(t: Transport, status: NodeStatus) -> NodeStatusWithPods:
    """Add each stale pid's pod UID, container id and runtime (read from its /proc/PID/cgroup on the node)."""
    pods = pods_for_pids(t, status.stale_pids)
    rows = [{"pid": pid, **(ref.to_dict() if ref else {"pod_uid": None, "container_id": None, "runtime": None})}
            for pid, ref in sorted(pods.items())]
    return NodeStatusWithPods(**{f.name: getattr(status, f.name) for f in fields(status)}, stale_processes=rows)


def stale_table(fleet: FleetResult[NodeStatus]) -> None:
    """A second `status` table: every process still on an old library, with its pod and container."""
    import sys

    from rich.console import Console
    from rich.table import Table

    rows = [(o.node, p) for o in fleet.outcomes if isinstance(o.result, NodeStatusWithPods)
            for p in o.result.stale_processes]
    if not rows:
        return
    table = Table(title="processes still on an old library (restart their containers)", title_justify="left")
    for col in ("node", "pid", "pod uid", "container", "runtime"):
        table.add_column(col, overflow="fold")
    for node, p in rows:
        table.add_row(node, str(p["pid"]), p["pod_uid"] or "(not in a pod)", (p["container_id"] or "-")[:13],
                      p.get("runtime") or "-")
    Console(file=sys.stdout, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200).print(table)
