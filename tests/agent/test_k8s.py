"""Pods from cgroups, stale processes from /proc, node annotations and restart-plan against a fake API server."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from agent_helpers import Host, Image
from click.testing import CliRunner
from fake_kube import FakeKube

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.agent.metrics import render as render_metrics
from vgpu_patch.commands.agent import cli as agent_cli
from vgpu_patch.commands.restart_plan import cli as restart_plan
from vgpu_patch.k8s import api
from vgpu_patch.k8s.cgroup import parse_cgroup, pod_of
from vgpu_patch.k8s.procmap import by_pod, pods_for_pids, scan
from vgpu_patch.k8s.report import ANN_SHA, ANN_STALE, NodeReporter
from vgpu_patch.transport.local import LocalTransport

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
UID_A = "0e8a1b52-3c4d-4e5f-9a6b-7c8d9e0f1a2b"
UID_B = "5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
CID_A = "3f1c2a9b8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c"
CID_B = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cgroup_fixture(name: str) -> None:
    ref = parse_cgroup((FIXTURES / f"{name}.cgroup").read_text())
    assert (ref.to_dict() if ref else None) == EXPECTED[name]


def test_every_fixture_has_an_expectation() -> None:
    assert {p.stem for p in FIXTURES.glob("*.cgroup")} == set(EXPECTED)


def test_garbage_and_missing_processes_are_not_pods(tmp_path: Path) -> None:
    assert parse_cgroup("") is None and parse_cgroup("not a cgroup file\n::\n") is None
    assert parse_cgroup("0::/kubepods.slice/kubepods-podNOTAUID.slice/cri-containerd-xyz.scope") is None
    assert pod_of(999_999_999, tmp_path) is None


def _maps_line(inode: int, path: str, deleted: bool = False) -> str:
    return f"7f3a1c000000-7f3a1c020000 r-xp 00000000 fd:01 {inode}    {path}{' (deleted)' if deleted else ''}\n"


def fake_proc(root: Path, procs: dict[int, tuple[list[str], str | None]]) -> Path:
    """A /proc with <pid>/maps and <pid>/cgroup (cgroup None = no file, as for a process that just exited)."""
    for pid, (maps, cgroup_fixture) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "maps").write_text("".join(maps))
        if cgroup_fixture:
            (d / "cgroup").write_text((FIXTURES / f"{cgroup_fixture}.cgroup").read_text())
    (root / "self").mkdir(exist_ok=True)  # non-numeric entries are ignored
    return root




def test_scan_finds_stale_processes_and_their_pods(tmp_path: Path) -> None:
    live_ino = 5000
    proc = fake_proc(tmp_path / "proc", {
        100: ([_maps_line(4000, "/usr/local/vgpu/libvgpu.so"), _maps_line(77, "/usr/lib/libc.so.6")],
              "v2-systemd-containerd-burstable"),
        101: ([_maps_line(live_ino, "/usr/local/vgpu/libvgpu.so")], "v2-systemd-containerd-burstable"),  # current
        102: ([_maps_line(5000, "/usr/local/vgpu/libvgpu.so", deleted=True)], "v1-systemd-cri-dockerd"),
        103: ([_maps_line(3000, "/usr/local/vgpu/libvgpu.so.v2.6.0")], "v2-host-service"),  # a host process
        104: ([_maps_line(77, "/usr/lib/libc.so.6")], "v2-systemd-crio-besteffort"),  # never loaded the shim
        105: ([_maps_line(4000, "/usr/local/vgpu/libvgpu.so")], None),  # cgroup unreadable: not attributed
        106: ([_maps_line(4000, "/srv/other/libvgpu.so")], "v2-systemd-crio-besteffort"),  # another directory
    })
    procs = scan(proc, ["/usr/local/vgpu"], live_ino, skip_pid=-1)
    assert [p.pid for p in procs] == [100, 102, 103, 105]
    assert procs[0].pod and procs[0].pod.pod_uid == UID_A and procs[0].pod.container_id == CID_A
    assert procs[1].deleted and procs[1].pod and procs[1].pod.runtime == "docker"
    pods, host = by_pod(procs)
    assert [(p.pod_uid, p.pids, p.containers) for p in pods] == [(UID_A, [100, 102], [CID_A, CID_B])]
    assert host == [103, 105]
    assert scan(tmp_path / "no-proc", ["/usr/local/vgpu"], live_ino) == []


def test_pods_for_pids_reads_cgroups_over_the_transport() -> None:
    me = os.getpid()
    got = pods_for_pids(LocalTransport(), [me, 999_999_999])
    assert set(got) == {me, 999_999_999} and got[999_999_999] is None
    assert got[me] == parse_cgroup(Path(f"/proc/{me}/cgroup").read_text())
    assert pods_for_pids(LocalTransport(), []) == {}


def _stale_proc(tmp_path: Path) -> Path:
    return fake_proc(tmp_path / "proc", {
        4242: ([_maps_line(1, "/usr/local/vgpu/libvgpu.so")], "v2-systemd-containerd-burstable"),
        4243: ([_maps_line(1, "/usr/local/vgpu/libvgpu.so")], "v2-systemd-containerd-burstable"),
        4300: ([_maps_line(2, "/usr/local/vgpu/libvgpu.so")], "v2-cgroupns-relative"),
        4400: ([_maps_line(3, "/usr/local/vgpu/libvgpu.so")], "v2-host-service"),
    })


def test_agent_annotates_its_node_and_names_the_pods(image: Image, host: Host, tmp_path: Path) -> None:
    with FakeKube() as kube:
        kube.add_node("gpu-node-1")
        kube.add_pod("ml", "trainer-0", UID_A, "gpu-node-1")
        kube.add_pod("ml", "other-node-pod", UID_B, "gpu-node-2")
        reporter = NodeReporter(api.Client(kube.url), "gpu-node-1")
        agent = Agent(AgentConfig(library=image.library, host_root=host.root, proc=_stale_proc(tmp_path),
                                  status_file=tmp_path / "run" / "agent.json", reporter=reporter))
        status = agent.run(once=True)
        assert status.ready and status.api == "ok" and status.stale_processes == 4
        ann = kube.nodes["gpu-node-1"]["metadata"]["annotations"]
        assert ann[ANN_SHA] == image.sha256
        doc = json.loads(ann[ANN_STALE])
        assert doc["live_sha256"] == image.sha256 and doc["host_pids"] == [4400]
        assert [(p["namespace"], p["name"], p["pod_uid"], p["pids"]) for p in doc["pods"]] == [
            ("ml", "trainer-0", UID_A, [4242, 4243, 4300])]
        (patch,) = kube.calls("PATCH")
        assert patch.headers["Content-Type"] == "application/merge-patch+json"
        (lst,) = [r for r in kube.calls("GET") if r.path == "/api/v1/pods"]
        assert lst.query == {"fieldSelector": "spec.nodeName=gpu-node-1"}
        # an unchanged report is not patched again
        agent.step()
        assert len(kube.calls("PATCH")) == 1
        metrics = render_metrics(agent.snapshot())
        assert f'vgpu_patch_agent_stale_pod_processes{{pod_uid="{UID_A}",namespace="ml",pod="trainer-0"}} 3' in metrics
        assert 'vgpu_patch_agent_stale_pod_processes{pod_uid="",namespace="",pod=""} 1' in metrics
        assert "\nvgpu_patch_agent_stale_processes 4\n" in metrics
        file_doc = json.loads((tmp_path / "run" / "agent.json").read_text())
        assert file_doc["stale_pods"][0]["name"] == "trainer-0" and file_doc["ready"]


def test_api_failure_is_reported_but_does_not_change_readiness(image: Image, host: Host, tmp_path: Path) -> None:
    reporter = NodeReporter(api.Client("http://127.0.0.1:9", timeout=2), "gpu-node-1")
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, proc=_stale_proc(tmp_path),
                              status_file=tmp_path / "s.json", reporter=reporter))
    status = agent.run(once=True)
    assert status.ready and status.api == "error" and status.api_errors == 1
    assert "cannot reach the API server" in (status.api_error or "")
    assert status.stale_pods[0]["name"] is None  # unnamed without the API, still listed by UID
    assert "vgpu_patch_agent_api_errors_total 1" in render_metrics(agent.snapshot())


def test_token_file_is_sent_and_a_refusal_is_one_line(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    with FakeKube(token="s3cret") as kube:
        kube.add_node("n1")
        assert api.Client(kube.url, token_file=tok).get_node("n1")["metadata"]["name"] == "n1"
        assert kube.requests[-1].headers["Authorization"] == "Bearer s3cret"
        with pytest.raises(api.ApiError, match=r"^GET /api/v1/nodes/n1: HTTP 401: Unauthorized$"):
            api.Client(kube.url, token="wrong").get_node("n1")


def _annotated(kube: FakeKube) -> None:
    kube.add_node("gpu-node-1", {ANN_SHA: "ab" * 32, ANN_STALE: json.dumps({
        "time": "2026-12-01T10:00:00Z", "live_sha256": "ab" * 32, "live_path": "/usr/local/vgpu/libvgpu.so",
        "host_pids": [4400], "truncated": 0, "pods": [
            {"namespace": "ml", "name": "trainer-0", "pod_uid": UID_A, "containers": [CID_A], "pids": [4242]},
            {"namespace": "ml", "name": "restarted", "pod_uid": "old-uid", "containers": [CID_B], "pids": [4300]},
            {"namespace": "web", "name": "guarded", "pod_uid": UID_B, "containers": [CID_B], "pids": [4500]},
        ]})})
    kube.add_node("cpu-node")  # no agent there: not listed
    kube.add_pod("ml", "trainer-0", UID_A, "gpu-node-1")
    kube.add_pod("ml", "restarted", "new-uid", "gpu-node-1")  # a StatefulSet pod recreated under its name
    kube.add_pod("web", "guarded", UID_B, "gpu-node-1")


def test_static_and_unmanaged_pods_are_not_evicted_by_default() -> None:
    with FakeKube() as kube:
        kube.add_node("gpu-node-1", {ANN_STALE: json.dumps({"pods": [
            {"namespace": "kube-system", "name": "etcd-gpu-node-1", "pod_uid": "u1", "pids": [1]},
            {"namespace": "ml", "name": "bare", "pod_uid": "u2", "pids": [2]},
            {"namespace": "ml", "name": "ds-pod", "pod_uid": "u3", "pids": [3]}]})})
        kube.add_pod("kube-system", "etcd-gpu-node-1", "u1", "gpu-node-1", owner="Node",
                     annotations={"kubernetes.io/config.mirror": "abc"})
        kube.add_pod("ml", "bare", "u2", "gpu-node-1", owner=None)
        kube.add_pod("ml", "ds-pod", "u3", "gpu-node-1", owner="DaemonSet")
        res = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--evict", "--yes", "--json"])
        assert res.exit_code == 0, res.output
        pods = {p["name"]: p for p in json.loads(res.stdout)["pods"]}
        assert pods["etcd-gpu-node-1"]["state"] == "static" and pods["bare"]["state"] == "unmanaged"
        assert pods["ds-pod"]["state"] == "evicted" and pods["ds-pod"]["owner"] == "DaemonSet"
        assert [r.path for r in kube.calls("POST")] == ["/api/v1/namespaces/ml/pods/ds-pod/eviction"]
        res = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--evict", "--yes", "--include-unmanaged",
                                                "--json"])
        assert {p["name"]: p["state"] for p in json.loads(res.stdout)["pods"]}["bare"] == "evicted"
        assert ("kube-system", "etcd-gpu-node-1") in kube.pods  # a static pod is never evicted


def test_restart_plan_lists_only_pods_still_on_the_old_library() -> None:
    with FakeKube() as kube:
        _annotated(kube)
        res = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        states = {p["name"]: p["state"] for p in doc["pods"]}
        assert states == {"trainer-0": "restart", "restarted": "gone", "guarded": "restart"}
        assert [n["node"] for n in doc["nodes"]] == ["gpu-node-1"] and doc["nodes"][0]["host_pids"] == [4400]
        assert not kube.calls("POST")
        table = CliRunner().invoke(restart_plan, ["--api-server", kube.url])
        assert "ml/trainer-0" in table.stdout and "(host processes)" in table.stdout


def test_evict_respects_pod_disruption_budgets() -> None:
    with FakeKube() as kube:
        _annotated(kube)
        kube.pdb_blocked.add(("web", "guarded"))
        dry = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--evict", "--dry-run", "--json"])
        assert dry.exit_code == 3, dry.output  # one would be blocked
        assert {p["name"]: p["state"] for p in json.loads(dry.stdout)["pods"]}["trainer-0"] == "would-evict"
        assert all(r.query == {"dryRun": "All"} for r in kube.calls("POST")) and ("ml", "trainer-0") in kube.pods
        kube.requests.clear()
        res = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--evict", "--yes", "--json"])
        assert res.exit_code == 3, res.output
        pods = {p["name"]: p for p in json.loads(res.stdout)["pods"]}
        assert pods["trainer-0"]["state"] == "evicted" and ("ml", "trainer-0") not in kube.pods
        assert pods["guarded"]["state"] == "blocked" and "PodDisruptionBudget" in pods["guarded"]["detail"]
        assert ("web", "guarded") in kube.pods  # never forced (no DELETE, no retry without the budget)
        posts = kube.calls("POST")
        assert {r.path for r in posts} == {"/api/v1/namespaces/ml/pods/trainer-0/eviction",
                                           "/api/v1/namespaces/web/pods/guarded/eviction"}
        body = next(r.body for r in posts if r.path.endswith("trainer-0/eviction"))
        assert body["apiVersion"] == "policy/v1" and body["kind"] == "Eviction"
        assert body["deleteOptions"] == {"preconditions": {"uid": UID_A}}
        assert not kube.calls("DELETE")
        kube.pdb_blocked.clear()
        again = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--evict", "--yes", "--json"])
        assert again.exit_code == 0 and ("web", "guarded") not in kube.pods


def test_evict_asks_first_and_api_failures_are_one_line(tmp_path: Path) -> None:
    with FakeKube() as kube:
        _annotated(kube)
        res = CliRunner().invoke(restart_plan, ["--api-server", kube.url, "--evict"], input="n\n")
        assert res.exit_code != 0 and not kube.calls("POST")
    res = CliRunner().invoke(restart_plan, ["--api-server", "http://127.0.0.1:9"])
    assert res.exit_code != 0 and isinstance(res.exception, api.ApiError)
    assert "cannot reach the API server" in str(res.exception) and "\n" not in str(res.exception)
    assert CliRunner().invoke(restart_plan, ["--dry-run"]).exit_code == 2


def test_kubeconfig_token_and_a_malformed_plugin(tmp_path: Path) -> None:
    with FakeKube(token="kc-token") as kube:
        kube.add_node("n1")
        cfg = tmp_path / "config"
        cfg.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": kube.url}}],
            "users": [{"name": "u", "user": {"token": "kc-token"}},
                      {"name": "eks", "user": {"exec": {"command": "aws"}}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}},
                         {"name": "e", "context": {"cluster": "k", "user": "eks"}}]}))
        assert api.from_kubeconfig(cfg).list_nodes()[0]["metadata"]["name"] == "n1"
        with pytest.raises(api.UsageError, match="exec apiVersion None"):  # plugins: tests/agent/test_k8s_exec.py
            api.from_kubeconfig(cfg, "e")
        with pytest.raises(api.UsageError, match="no context 'nope'"):
            api.from_kubeconfig(cfg, "nope")


def test_the_command_reports_with_a_token(image: Image, host: Host, tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("agent-token")
    with FakeKube(token="agent-token") as kube:
        kube.add_node("gpu-node-3")
        kube.add_pod("ml", "trainer-0", UID_A, "gpu-node-3")
        res = CliRunner().invoke(agent_cli, [
            "--library", str(image.library), "--host-root", str(host.root), "--once", "--json",
            "--status-file", str(tmp_path / "s.json"), "--proc-root", str(_stale_proc(tmp_path)),
            "--report", "on", "--api-server", kube.url, "--token-file", str(tok), "--node-name", "gpu-node-3"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["api"] == "ok"
        doc = json.loads(kube.nodes["gpu-node-3"]["metadata"]["annotations"][ANN_STALE])
        assert doc["pods"][0]["name"] == "trainer-0"
    res = CliRunner().invoke(agent_cli, ["--library", str(image.library), "--host-root", str(host.root), "--once",
                                         "--report", "on"])
    assert res.exit_code == 2 and "no service-account token" in res.output


def test_unknown_pod_uids_are_not_relisted_every_check() -> None:
    with FakeKube() as kube:
        kube.add_node("n1")
        rep = NodeReporter(api.Client(kube.url), "n1")
        from vgpu_patch.k8s.procmap import StalePod

        rep.resolve([StalePod("deleted-uid")], now=1000.0)
        rep.resolve([StalePod("deleted-uid")], now=1010.0)
        assert len([r for r in kube.requests if r.path == "/api/v1/pods"]) == 1
        rep.resolve([StalePod("deleted-uid")], now=1061.0)
        assert len([r for r in kube.requests if r.path == "/api/v1/pods"]) == 2


def test_scan_scope_tells_host_from_a_pod_namespace(tmp_path: Path) -> None:
    from vgpu_patch.k8s.procmap import INIT_PID_NS, scope

    assert scope(tmp_path) == "unknown"
    (tmp_path / "1" / "ns").mkdir(parents=True)
    (tmp_path / "1" / "ns" / "pid").symlink_to(INIT_PID_NS)
    assert scope(tmp_path) == "host"
    (tmp_path / "1" / "ns" / "pid").unlink()
    (tmp_path / "1" / "ns" / "pid").symlink_to("pid:[4026532999]")
    assert scope(tmp_path) == "pid-namespace"
    real = os.readlink("/proc/self/ns/pid")
    assert scope("/proc") == ("host" if real == INIT_PID_NS else "pid-namespace")
