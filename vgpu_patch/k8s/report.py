"""The agent's report to the API: node annotations naming the live library and the pods still on an old one.

Annotations on the agent's Node (merge-patched, so other annotations are untouched):
- `vgpu-patch/live-sha256`: the sha256 of the live library file;
- `vgpu-patch/stale`: JSON `{"time", "live_sha256", "live_path", "pods": [{"namespace", "name", "pod_uid",
  "containers", "pids"}], "host_pids": [...], "truncated": N}`; `vgpu-patch restart-plan` reads it.
Events on the Node (namespace default) say when the agent refuses (state error) or yields to an operator.
The service account needs `patch` on nodes, `list` on pods and `create` on events (the chart's and
`vgpu-patch daemonset --rbac`'s ClusterRole grant exactly that; RBAC cannot narrow them to this node).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .api import ApiError, Client
from .procmap import StalePod

ANN_SHA = "vgpu-patch/live-sha256"
ANN_STALE = "vgpu-patch/stale"
MAX_PODS = 200  # an annotation set must stay under 256 KiB
REFRESH = 600.0  # re-patch an unchanged report this often, so its time shows the agent is alive
RELIST = 60.0  # list the node's pods again for a UID still unknown at most this often (a deleted pod never shows)


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass
class NodeReporter:
    client: Client
    node: str
    _names: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod uid -> (namespace, name)
    _last: str | None = None
    _last_time: float = 0.0
    _listed: float = -RELIST

    def resolve(self, pods: list[StalePod], now: float | None = None) -> None:
        """Fill in namespace/name from the API (one list of this node's pods when an unknown uid shows up)."""
        now = time.monotonic() if now is None else now
        if any(p.pod_uid not in self._names for p in pods) and now - self._listed >= RELIST:
            self._listed = now
            for item in self.client.pods_on_node(self.node):
                meta = item.get("metadata") or {}
                if meta.get("uid"):
                    self._names[meta["uid"]] = (str(meta.get("namespace")), str(meta.get("name")))
        for p in pods:
            if p.pod_uid in self._names:
                p.namespace, p.name = self._names[p.pod_uid]

    def report(self, live_sha256: str | None, live_path: str | None, pods: list[StalePod], host_pids: list[int],
               now: float | None = None) -> bool:
        """Patch the annotations when the report changed (or every REFRESH seconds); True when it patched."""
        now = time.time() if now is None else now
        if pods:
            self.resolve(pods)
        body = {"live_sha256": live_sha256, "live_path": live_path,
                "pods": [p.to_dict() for p in pods[:MAX_PODS]], "host_pids": host_pids[:MAX_PODS],
                "truncated": max(0, len(pods) - MAX_PODS)}
        key = json.dumps(body, sort_keys=True)
        if key == self._last and now - self._last_time < REFRESH:
            return False
        doc = {"time": utc(now), **body}
        self.client.annotate_node(self.node, {ANN_SHA: live_sha256 or "", ANN_STALE: json.dumps(doc, sort_keys=True)})
        self._last, self._last_time = key, now
        return True

    def event(self, event_type: str, reason: str, message: str) -> None:
        """A Warning/Normal Event on the Node, for a refusal or a yield an operator should see."""
        self.client.node_event(self.node, event_type, reason, message)


__all__ = ["ANN_SHA", "ANN_STALE", "ApiError", "NodeReporter"]
