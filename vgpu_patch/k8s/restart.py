"""`vgpu-patch restart-plan`: the pods still running an old library, read from the agents' node annotations.

For each node the agent annotated (see report.py), every listed pod is checked against the API (one list
of the node's pods): a pod that is gone or whose UID changed (recreated under the same name) has restarted
already and is left out; a pod bound to another node is `refused`, never evicted. With `evict`,
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
    # restart | gone | unnamed | static | unmanaged | refused (on another node) | unknown (the API kept failing)
    # | evicted | would-evict | blocked | failed
    state: str = "restart"
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


def _ints(v: object) -> list[int]:
    return [x for x in v if isinstance(x, int) and not isinstance(x, bool)] if isinstance(v, list) else []


def _strs(v: object) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _node_report(node: dict) -> tuple[dict, list[PlanEntry]]:
    """The node's summary and its listed pods; an annotation written by anyone is read without trusting it."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name"))
    ann = meta.get("annotations") or {}
    info: dict = {"node": name, "live_sha256": _str(ann.get(ANN_SHA)), "reported_at": None, "host_pids": [],
                  "problem": None}
    raw = ann.get(ANN_STALE)
    if raw is None:
        info["problem"] = "no report: is the agent running there with --rbac?"
        return info, []
    try:
        doc = json.loads(raw)
    except (ValueError, TypeError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("pods") or [], list):
        info["problem"] = f"unreadable {ANN_STALE} annotation (not a JSON object with a list of pods)"
        return info, []
    info.update(reported_at=_str(doc.get("time")), host_pids=_ints(doc.get("host_pids")))
    pods = doc.get("pods") or []
    good = [p for p in pods if isinstance(p, dict) and _str(p.get("pod_uid"))]
    problems = []
    if len(good) < len(pods):
        problems.append(f"{len(pods) - len(good)} unreadable pod entries in {ANN_STALE} (not an object with a pod_uid)")
    if isinstance(doc.get("truncated"), int) and doc["truncated"] > 0:
        problems.append(f"{doc['truncated']} more pods not listed (annotation size cap)")
    info["problem"] = "; ".join(problems) or None
    entries = [PlanEntry(name, _str(p.get("namespace")), _str(p.get("name")), str(p["pod_uid"]),
                         _strs(p.get("containers")), _ints(p.get("pids")), info["live_sha256"], info["reported_at"])
               for p in good]
    return info, entries


def _judge(e: PlanEntry, pod: dict | None) -> None:
    """Set the entry's state from the pod the API holds under its name (None: no such pod)."""
    meta = (pod or {}).get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("controller")]
    e.owner = str(owners[0].get("kind")) if owners else None
    bound = ((pod or {}).get("spec") or {}).get("nodeName")
    if pod is None or meta.get("uid") != e.pod_uid:
        e.state, e.detail = "gone", "restarted or deleted since the report"
    elif bound != e.node:
        e.state = "refused"
        e.detail = (f"runs on node {bound or '(none)'}, not on {e.node} whose report names it: "
                    "only a node's own pods are evicted")
    elif "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        e.state = "static"
        e.detail = "a static pod: evicting its mirror does not restart it; restart it on the node"
    elif e.owner is None:
        e.state = "unmanaged"
        e.detail = "no controller recreates it: an eviction deletes it for good (--include-unmanaged)"


def _by_name(pods: list[dict]) -> dict[tuple[str, str], dict]:
    out = {}
    for p in pods:
        meta = p.get("metadata") or {}
        out[(str(meta.get("namespace")), str(meta.get("name")))] = p
    return out


def build_plan(client: Client, *, nodes: list[str] | None = None, label_selector: str | None = None) -> Plan:
    """Read the annotations of the chosen nodes (all by default) and check each listed pod still exists there.

    One list of each node's pods (fieldSelector spec.nodeName) answers for every pod bound to it; only a pod
    missing from that list is looked up by name (gone, or on another node: then it is `refused`). A read
    the API keeps failing (429, 5xx, no answer) after its retries leaves that pod `unknown`.
    """
    plan = Plan()
    items = [client.get_node(n) for n in nodes] if nodes else client.list_nodes(label_selector)
    for node in items:
        info, entries = _node_report(node)
        if not nodes and info["problem"] and info["problem"].startswith("no report"):
            continue  # not a node the agent runs on
        plan.nodes.append(info)
        named = [e for e in entries if e.namespace and e.name]
        try:
            bound = _by_name(client.pods_on_node(info["node"])) if named else {}
        except ApiError as err:
            bound, listed = {}, str(err)
        else:
            listed = ""
        for e in entries:
            plan.entries.append(e)
            if not (e.namespace and e.name):
                e.state = "unnamed"
                e.detail = "the agent could not resolve this pod UID (no API access when it scanned?)"
            elif listed:
                e.state, e.detail = "unknown", f"cannot list the node's pods: {listed}"
            elif (e.namespace, e.name) in bound:
                _judge(e, bound[(e.namespace, e.name)])
            else:
                try:
                    _judge(e, client.get_pod(e.namespace, e.name))
                except ApiError as err:
                    e.state, e.detail = "unknown", str(err)
    return plan


def evict(client: Client, plan: Plan, *, dry_run: bool = False, include_unmanaged: bool = False) -> None:
    """Evict every pod still to restart; a PodDisruptionBudget refusal (HTTP 429) is `blocked`, not forced.

    Like `kubectl drain`, a pod no controller would recreate is left alone unless `include_unmanaged`.
    Only pods bound to the reporting node reach here (build_plan marks the others `refused`). When the API
    does not answer an eviction (a timeout, a 5xx) it may still have applied it: the pod is looked up again.
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
            elif (err.status is None or err.status >= 500) and not dry_run:
                _recheck(client, e, err)
            else:
                e.state, e.detail = "failed", str(err)


def _recheck(client: Client, e: PlanEntry, err: ApiError) -> None:
    """After an eviction with no clear answer: evicted when the pod is gone or being deleted, else failed."""
    assert e.namespace and e.name
    try:
        pod = client.get_pod(e.namespace, e.name)
    except ApiError as again:
        e.state, e.detail = "unknown", f"{err}; then the pod could not be looked up: {again}"
        return
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != e.pod_uid or meta.get("deletionTimestamp"):
        e.state, e.detail = "evicted", f"the API's answer was lost ({err}), but the pod is gone or terminating"
    else:
        e.state, e.detail = "failed", str(err)
