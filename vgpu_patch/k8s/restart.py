"""`vgpu-patch restart-plan`: the pods still running an old library, read from the agents' node annotations.

For each node the agent annotated (see report.py), every listed pod is looked up again: a pod that is gone
or whose UID changed (recreated under the same name) has restarted already and is left out. With `evict`,
each remaining pod gets an Eviction (policy/v1): the API server applies PodDisruptionBudgets and answers
429 while one forbids the eviction; that is reported as `blocked`, never forced.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .api import ApiError, Client
from .report import ANN_SHA, ANN_STALE


@dataclass
class PlanEntry:
    node: str
    namespace: str | None
    name: str | None
    pod_uid: str
    containers: list[str]
    pids: list[int]
    live_sha256: str | None
    reported_at: str | None
    state: str = "restart"  # restart | gone | unnamed | static | unmanaged | evicted | would-evict | blocked | failed
    detail: str = ""
    owner: str | None = None  # the controlling owner's kind (ReplicaSet, StatefulSet, DaemonSet, Job, ...)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    entries: list[PlanEntry] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)  # node, live_sha256, reported_at, host_pids, problem

    def to_dict(self) -> dict:
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.state] = counts.get(e.state, 0) + 1
        return {"schema": 1, "nodes": self.nodes, "pods": [e.to_dict() for e in self.entries], "counts": counts}


def _node_report(node: dict) -> tuple[dict, list[PlanEntry]]:
    meta = node.get("metadata") or {}
    name = str(meta.get("name"))
    ann = meta.get("annotations") or {}
    info: dict = {"node": name, "live_sha256": ann.get(ANN_SHA) or None, "reported_at": None, "host_pids": [],
                  "problem": None}
    raw = ann.get(ANN_STALE)
    if raw is None:
        info["problem"] = "no report: is the agent running there with --rbac?"
        return info, []
    try:
        doc = json.loads(raw)
        pods = list(doc.get("pods") or [])
    except (ValueError, AttributeError, TypeError):
        info["problem"] = f"unreadable {ANN_STALE} annotation"
        return info, []
    info.update(reported_at=doc.get("time"), host_pids=list(doc.get("host_pids") or []))
    if doc.get("truncated"):
        info["problem"] = f"{doc['truncated']} more pods not listed (annotation size cap)"
    entries = [PlanEntry(name, p.get("namespace"), p.get("name"), str(p.get("pod_uid")),
                         list(p.get("containers") or []), list(p.get("pids") or []), info["live_sha256"],
                         info["reported_at"]) for p in pods]
    return info, entries


def build_plan(client: Client, *, nodes: list[str] | None = None, label_selector: str | None = None) -> Plan:
    """Read the annotations of the chosen nodes (all by default) and check each listed pod still exists."""
    plan = Plan()
    items = [client.get_node(n) for n in nodes] if nodes else client.list_nodes(label_selector)
    for node in items:
        info, entries = _node_report(node)
        if not nodes and info["problem"] and info["problem"].startswith("no report"):
            continue  # not a node the agent runs on
        plan.nodes.append(info)
        for e in entries:
            if not (e.namespace and e.name):
                e.state = "unnamed"
                e.detail = "the agent could not resolve this pod UID (no API access when it scanned?)"
            else:
                pod = client.get_pod(e.namespace, e.name)
                meta = (pod or {}).get("metadata") or {}
                owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
                e.owner = str(owners[0].get("kind")) if owners else None
                if pod is None or meta.get("uid") != e.pod_uid:
                    e.state, e.detail = "gone", "restarted or deleted since the report"
                elif "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
                    e.state = "static"
                    e.detail = "a static pod: evicting its mirror does not restart it; restart it on the node"
                elif e.owner is None:
                    e.state = "unmanaged"
                    e.detail = "no controller recreates it: an eviction deletes it for good (--include-unmanaged)"
            plan.entries.append(e)
    return plan


def evict(client: Client, plan: Plan, *, dry_run: bool = False, include_unmanaged: bool = False) -> None:
    """Evict every pod still to restart; a PodDisruptionBudget refusal (HTTP 429) is `blocked`, not forced.

    Like `kubectl drain`, a pod no controller would recreate is left alone unless `include_unmanaged`.
    """
    wanted = ("restart", "unmanaged") if include_unmanaged else ("restart",)
    for e in plan.entries:
        if e.state not in wanted or not (e.namespace and e.name):
            continue
        try:
            client.evict(e.namespace, e.name, e.pod_uid, dry_run=dry_run)
            e.state, e.detail = ("would-evict", "dry run: the API accepted it") if dry_run else ("evicted", "")
        except ApiError as err:
            if err.status == 429:
                e.state = "blocked"
                why = err.body.get("message") or "HTTP 429"
                e.detail = f"a PodDisruptionBudget forbids it now ({why}); retry later"
            elif err.status == 404:
                e.state, e.detail = "gone", "deleted meanwhile"
            else:
                e.state, e.detail = "failed", str(err)
