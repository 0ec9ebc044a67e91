"""restart-plan against a fake API server that lies, fails and times out; the agent's RBAC covers its calls only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import Host, Image
from click.testing import CliRunner, Result
from fake_kube import FakeKube

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.commands.restart_plan import cli as restart_plan
from vgpu_patch.k8s import api
from vgpu_patch.k8s.daemonset import DaemonSetOptions, render_rbac
from vgpu_patch.k8s.report import ANN_STALE, NodeReporter
from vgpu_patch.k8s.restart import build_plan, evict

NODE = "gpu-node-1"


def report(kube: FakeKube, pods: object, node: str = NODE) -> None:
    kube.add_node(node, {ANN_STALE: json.dumps({"time": "2026-12-01T10:00:00Z", "pods": pods})})


def entry(name: str, uid: str, ns: str = "ml") -> dict:
    return {"namespace": ns, "name": name, "pod_uid": uid, "containers": ["c1"], "pids": [42]}


def plan(kube: FakeKube, *extra: str) -> tuple[Result, dict]:
    res = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--json", *extra])
    assert res.stdout.strip(), res.output
    return res, json.loads(res.stdout)


def states(doc: dict) -> dict[str, str]:
    return {p["name"] or p["pod_uid"]: p["state"] for p in doc["pods"]}


def test_a_report_naming_another_nodes_pod_never_evicts_it() -> None:
    with FakeKube() as kube:
        report(kube, [entry("mine", "u1"), entry("theirs", "u2")])
        kube.add_node("gpu-node-2")
        kube.add_pod("ml", "mine", "u1", NODE)
        kube.add_pod("ml", "theirs", "u2", "gpu-node-2")  # right name and uid, but bound elsewhere
        res, doc = plan(kube, "--evict", "--yes")
        assert res.exit_code == 0, res.output
        assert states(doc) == {"mine": "evicted", "theirs": "refused"}
        detail = next(p["detail"] for p in doc["pods"] if p["name"] == "theirs")
        assert "runs on node gpu-node-2, not on gpu-node-1" in detail
        assert ("ml", "theirs") in kube.pods
        assert [r.path for r in kube.calls("POST")] == ["/api/v1/namespaces/ml/pods/mine/eviction"]


@pytest.mark.parametrize("raw", [
    [42, "x", None, [1], {"name": "no-uid"}, {"pod_uid": 7}],
    "pods-as-a-string",
    {"pods": "x"},
])
def test_unreadable_annotation_entries_are_a_problem_not_a_traceback(raw: object) -> None:
    with FakeKube() as kube:
        if isinstance(raw, list):
            report(kube, [*raw, {**entry("ok", "u1"), "pids": "12", "containers": 3}])
            kube.add_pod("ml", "ok", "u1", NODE)
        else:
            kube.add_node(NODE, {ANN_STALE: json.dumps(raw)})
        res, doc = plan(kube)
        assert res.exit_code == 0, res.output
        (node,) = doc["nodes"]
        assert "unreadable" in node["problem"]
        if isinstance(raw, list):
            assert "6 unreadable pod entries" in node["problem"]
            (ok,) = doc["pods"]
            assert ok["state"] == "restart" and ok["pids"] == [] and ok["containers"] == []


def test_one_list_per_node_answers_for_20000_pods() -> None:
    with FakeKube() as kube:
        pods = [entry(f"p{i}", f"u{i}") for i in range(20000)]
        report(kube, pods)
        for i in range(20000):
            kube.add_pod("ml", f"p{i}", f"u{i}", NODE)
        res, doc = plan(kube)
        assert res.exit_code == 0 and doc["counts"] == {"restart": 20000}
        assert [(r.method, r.path) for r in kube.requests] == [("GET", "/api/v1/nodes"), ("GET", "/api/v1/pods")]


def test_transient_api_errors_are_retried_then_the_pod_is_unknown() -> None:
    with FakeKube() as kube:
        report(kube, [entry("a", "u1"), entry("moved", "u2")])
        kube.add_pod("ml", "a", "u1", NODE)
        kube.add_pod("ml", "moved", "u2", "gpu-node-2")
        kube.fail[("GET", "/api/v1/pods")] = [429, 500]  # then the list works
        kube.fail[("GET", "/api/v1/namespaces/ml/pods/moved")] = [503] * 10  # never works
        res, doc = plan(kube, "--evict", "--yes")
        assert states(doc) == {"a": "evicted", "moved": "unknown"}
        assert "HTTP 503" in next(p["detail"] for p in doc["pods"] if p["name"] == "moved")
        assert res.exit_code == 3  # evicted one, could not judge the other
        assert len([r for r in kube.requests if r.path == "/api/v1/namespaces/ml/pods/moved"]) == 4  # 1 + 3 retries
        assert len(kube.calls("POST")) == 1


def test_a_failing_node_list_leaves_its_pods_unknown_not_the_plan_aborted() -> None:
    with FakeKube() as kube:
        report(kube, [entry("a", "u1")])
        kube.add_pod("ml", "a", "u1", NODE)
        kube.fail[("GET", "/api/v1/pods")] = [500] * 10
        res, doc = plan(kube)
        assert res.exit_code == 0 and states(doc) == {"a": "unknown"}


def test_an_eviction_whose_answer_is_lost_is_checked_again() -> None:
    with FakeKube() as kube:
        report(kube, [entry("a", "u1"), entry("b", "u2")])
        kube.add_pod("ml", "a", "u1", NODE)
        kube.add_pod("ml", "b", "u2", NODE)
        kube.slow[("POST", "/api/v1/namespaces/ml/pods/a/eviction")] = 1.5  # applied, answered too late
        kube.fail[("POST", "/api/v1/namespaces/ml/pods/b/eviction")] = [500]  # not applied
        client = api.Client(kube.url, timeout=0.5)
        p = build_plan(client)
        evict(client, p)
        got = {e.name: e for e in p.entries}
        assert got["a"].state == "evicted" and "answer was lost" in got["a"].detail
        assert got["b"].state == "failed" and "HTTP 500" in got["b"].detail
        assert ("ml", "a") not in kube.pods and ("ml", "b") in kube.pods
        assert len(kube.calls("POST")) == 2  # an eviction is never sent twice


# -- what the agent may do ----------------------------------------------------------------------------
def _allowed(rules: list[dict]) -> set[tuple[str, str]]:
    return {(verb, res) for r in rules for verb in r["verbs"] for res in r["resources"]}


def _verb(method: str, path: str) -> tuple[str, str]:
    parts = path.strip("/").split("/")
    resource = parts[-1] if len(parts) % 2 else parts[-2]
    kind = {"GET": "list" if len(parts) % 2 else "get", "PATCH": "patch", "POST": "create"}[method]
    return kind, resource


def test_the_agents_cluster_role_is_exactly_what_it_calls(image: Image, host: Host, tmp_path: Path) -> None:
    """No `get` on nodes: the agent only merge-patches its own; RBAC cannot narrow patch to one node name."""
    from test_k8s import UID_A, _stale_proc

    with FakeKube() as kube:
        kube.add_node(NODE)
        kube.add_pod("ml", "trainer-0", UID_A, NODE)
        agent = Agent(AgentConfig(library=image.library, host_root=host.root, proc=_stale_proc(tmp_path),
                                  status_file=tmp_path / "agent.json",
                                  reporter=NodeReporter(api.Client(kube.url), NODE)))
        agent.run(once=True)
        agent.cfg.reporter.event("Warning", "VgpuPatchRefused", "test")  # type: ignore[union-attr]
        used = {_verb(r.method, r.path) for r in kube.requests}
    role = next(d for d in render_rbac(DaemonSetOptions(image="x", rbac=True)) if d["kind"] == "ClusterRole")
    assert used == _allowed(role["rules"]) == {("patch", "nodes"), ("list", "pods"), ("create", "events")}
