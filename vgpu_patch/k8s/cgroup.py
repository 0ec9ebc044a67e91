"""Which pod and container a process belongs to, read from its /proc/PID/cgroup.

The kubelet puts every container in a cgroup whose path names the pod UID and the runtime's container id.
Layouts handled (cgroup v1 and v2 alike; v1 has one line per hierarchy, v2 the single `0::` line):
- systemd driver: `.../kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
  (CRI-O: `crio-<id>.scope`, its monitor `crio-conmon-<id>.scope`; cri-dockerd: `docker-<id>.scope`);
  Guaranteed pods sit directly under `kubepods.slice/kubepods-pod<uid>.slice`; kind nests it under `kubelet.slice`.
- cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>` (Guaranteed: `/kubepods/pod<uid>/<id>`; CRI-O names the
  container `crio-<id>`); nested runtimes (kind, a node in a container) put more components in front.
- Read from inside another cgroup namespace (an agent pod with a private cgroupns), paths are relative to the
  reader's root and start with `/..` components; only the components matter here.
Static (mirror) pods carry a 32-hex config hash as their UID; it is reported as it is.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# a pod component: systemd `kubepods[-qos]-pod<uid>.slice` (also `kubelet-kubepods-...`), cgroupfs `pod<uid>`
_POD = re.compile(rf"^(?:[a-z-]*kubepods(?:-(?P<sqos>burstable|besteffort))?-)?pod(?P<uid>{_UUID})(?:\.slice)?$")
_CTR_SCOPE = re.compile(r"^(?P<prefix>cri-containerd|crio-conmon|crio|docker|cri-o)-(?P<id>[0-9a-f]{64})\.scope$")
# cgroupfs driver: the bare id (containerd, cri-dockerd) or `crio-<id>` / `crio-conmon-<id>` (CRI-O)
_CTR_PLAIN = re.compile(r"^(?:(?P<prefix>crio-conmon|crio)-)?(?P<id>[0-9a-f]{64})$")
_RUNTIME = {"cri-containerd": "containerd", "crio": "cri-o", "cri-o": "cri-o", "crio-conmon": "cri-o",
            "docker": "docker"}


@dataclass(frozen=True)
class PodRef:
    """The pod (and container) a process runs in; `container_id` is None for a pod-level process (pause, conmon)."""

    pod_uid: str
    container_id: str | None
    runtime: str | None  # containerd | cri-o | docker | None (cgroupfs driver: the path does not say)
    qos: str  # guaranteed | burstable | besteffort
    driver: str  # systemd | cgroupfs

    def to_dict(self) -> dict:
        return asdict(self)


def parse_path(path: str) -> PodRef | None:
    """The pod in one cgroup path, None when the path is not a pod's (a host service, the root)."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    for i, part in enumerate(parts):
        m = _POD.match(part)
        if not m:
            continue
        systemd = part.endswith(".slice")
        uid = m.group("uid").replace("_", "-")
        if systemd:
            qos = m.group("sqos") or "guaranteed"
        else:
            prev = parts[i - 1] if i else ""
            qos = prev if prev in ("burstable", "besteffort") else "guaranteed"
        cid = runtime = None
        if i + 1 < len(parts):
            nxt = parts[i + 1]
            c = _CTR_SCOPE.match(nxt) or _CTR_PLAIN.match(nxt)
            if c:
                prefix = c.group("prefix")
                runtime = _RUNTIME.get(prefix) if prefix else None
                cid = None if prefix == "crio-conmon" else c.group("id")
        return PodRef(uid, cid, runtime, qos, "systemd" if systemd else "cgroupfs")
    return None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod named by a /proc/PID/cgroup file (v1 or v2); the line naming a container wins over a pod-only one."""
    best: PodRef | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ref = parse_path(fields[2])
        if ref is None:
            continue
        if ref.container_id:
            return ref
        best = best or ref
    return best


def pod_of(pid: int, proc: Path | str = "/proc") -> PodRef | None:
    """The pod of a running process, None when it is not in a pod or has exited."""
    try:
        text = (Path(proc) / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    return parse_cgroup(text)
