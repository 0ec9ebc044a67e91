"""The agent never says ready while in error; health, metrics and the status file agree; partial files are
never backups; an upgraded plugin's versioned file is followed (ld.so.preload) or refused loudly."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from agent_helpers import Host, Image, hami_copy_back, sha, wait_for
from click.testing import CliRunner

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.agent.metrics import health, render, serve
from vgpu_patch.agent.status import AgentStatus
from vgpu_patch.commands.agent import cli
from vgpu_patch.commands.status import cli as status_cli
from vgpu_patch.report.errors import DeployError


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def status(**kw: object) -> AgentStatus:
    s = AgentStatus(node="n", library="/opt/l.so", want_sha256="a" * 64, target_dir="/usr/local/vgpu")
    for k, v in kw.items():
        setattr(s, k, v)
    return s


@pytest.mark.parametrize("kw", [
    {"state": "ok", "live_sha256": "a" * 64},
    {"state": "ok", "live_sha256": "b" * 64},  # mid-repair: the live file is not ours yet
    {"state": "error", "live_sha256": "a" * 64, "last_error": "n:/usr/local/vgpu: several versioned libraries"},
    {"state": "yielded", "live_sha256": "b" * 64, "yielded_to": {"action": "rollback", "tool": "vgpu-patch 0.1.0"}},
    {"state": "starting"},
])
def test_every_view_gives_the_same_verdict(kw: dict) -> None:
    s = status(**kw)
    code, body = health(s, "/healthz", 120)
    assert (code, body) == health(s, "/readyz", 120)
    metric = int("\nvgpu_patch_agent_ready 1\n" in "\n" + render(s))
    assert (code == 200) == s.ready == s.to_dict()["ready"] == bool(metric)
    if code == 200:
        assert body == "ready\n" and s.to_dict()["reason"] == ""
    else:
        assert body.startswith("not ready: ") and "ok" not in body.split()  # never "ok" in a 503
        assert body == f"not ready: {s.to_dict()['reason']}\n"
    assert s.state != "error" or not s.ready


def test_liveness_notices_a_stuck_loop() -> None:
    now = time.time()
    assert health(status(heartbeat_unix=now - 5), "/livez", 120, now) == (200, "alive\n")
    code, body = health(status(heartbeat_unix=now - 500), "/livez", 120, now)
    assert code == 503 and body.startswith("stuck: the watch loop last turned 500s ago")
    assert "vgpu_patch_agent_heartbeat_age_seconds 500" in render(status(heartbeat_unix=now - 500), now)


class BlockingReporter:
    """A report call that hangs (an API server that never answers, a wedged lock): the loop stops turning."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def report(self, *a: object, **kw: object) -> bool:
        self.entered.set()
        self.release.wait(30)
        return False


def test_a_wedged_loop_fails_liveness_but_not_before(image: Image, host: Host, tmp_path: Path) -> None:
    rep = BlockingReporter()
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, interval=0.2, stuck_after=1.0, watch="poll",
                              status_file=tmp_path / "agent.json", reporter=rep, proc=None))  # type: ignore[arg-type]
    server = serve(agent.snapshot, 0, "127.0.0.1", stuck_after=1.0)
    port = server.server_address[1]
    thread = threading.Thread(target=agent.run, daemon=True)
    try:
        thread.start()
        assert rep.entered.wait(30)
        wait_for(lambda: get(f"http://127.0.0.1:{port}/livez")[0] == 503)
        code, body = get(f"http://127.0.0.1:{port}/livez")
        assert code == 503 and body.startswith("stuck:")
        rep.release.set()
        rep.report = lambda *a, **k: False  # type: ignore[method-assign]
        wait_for(lambda: get(f"http://127.0.0.1:{port}/livez") == (200, "alive\n"))
    finally:
        rep.release.set()
        agent.stop()
        thread.join(30)
        server.shutdown()


@pytest.mark.watch("inotify", 30.0)
def test_upgraded_plugin_file_named_by_preload_is_followed(running: Agent, image: Image, host: Host, vendor: Path,
                                                          tmp_path: Path) -> None:
    # the agent installed over libvgpu.so; the v2.6.0 plugin had the versioned file: start from that layout
    shutil.copy(vendor, host.libdir / "libvgpu.so.v2.6.0")
    wait_for(lambda: sha(host.libdir / "libvgpu.so.v2.6.0") == image.sha256)
    # the upgrade: v2.7.0's plugin drops its file beside ours and names it in ld.so.preload
    shutil.copy(vendor, host.libdir / "libvgpu.so.v2.7.0")
    (host.libdir / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so.v2.7.0\n")
    new = "/usr/local/vgpu/libvgpu.so.v2.7.0"
    wait_for(lambda: running.snapshot().live_path == new and running.snapshot().ready)
    assert sha(host.libdir / "libvgpu.so.v2.7.0") == image.sha256
    snap = running.snapshot()
    assert snap.live_path == "/usr/local/vgpu/libvgpu.so.v2.7.0" and snap.state == "ok"
    assert host.history()[-1]["path"] == "/usr/local/vgpu/libvgpu.so.v2.7.0"


@pytest.mark.watch("inotify", 30.0)
def test_upgrade_without_a_preload_choice_is_refused_and_unready(running: Agent, image: Image, host: Host,
                                                                 vendor: Path, tmp_path: Path) -> None:
    server = serve(running.snapshot, 0, "127.0.0.1")
    port = server.server_address[1]
    ready_marker = tmp_path / "run" / "ready"
    try:
        wait_for(lambda: running.snapshot().ready and ready_marker.exists())
        shutil.copy(vendor, host.libdir / "libvgpu.so.v2.6.0")
        wait_for(lambda: sha(host.libdir / "libvgpu.so.v2.6.0") == image.sha256)
        (host.libdir / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")  # names no versioned file
        shutil.copy(vendor, host.libdir / "libvgpu.so.v2.7.0")
        wait_for(lambda: running.snapshot().state == "error")
        snap = running.snapshot()
        assert not snap.ready and "several versioned libraries" in (snap.last_error or "")
        assert "ld.so.preload names none" in (snap.last_error or "")
        doc = json.loads((tmp_path / "run" / "agent.json").read_text())
        assert doc["ready"] is False and doc["state"] == "error" and doc["reason"].startswith("error: ")
        assert not ready_marker.exists()
        code, body = get(f"http://127.0.0.1:{port}/healthz")
        assert code == 503 and body.startswith("not ready: error: ") and "ok" not in body.split()
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 503
        metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
        assert "\nvgpu_patch_agent_ready 0\n" in metrics and "\nvgpu_patch_agent_error 1\n" in metrics
        assert sha(host.libdir / "libvgpu.so.v2.7.0") == sha(vendor)  # refused: nothing touched
        assert get(f"http://127.0.0.1:{port}/livez")[0] == 200  # alive: a restart would not fix this
    finally:
        server.shutdown()


@pytest.mark.parametrize("partial", ["empty", "truncated", "not-elf"])
def test_a_partial_live_file_is_never_a_backup_or_rollback_target(partial: str, image: Image, host: Host,
                                                                   vendor: Path, tmp_path: Path) -> None:
    data = vendor.read_bytes()
    host.live.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "not-elf": b"#!/bin/sh\n" * 20}[partial])
    res = CliRunner().invoke(cli, ["--library", str(image.library), "--host-root", str(host.root), "--once",
                                   "--status-file", str(tmp_path / "s.json"), "--no-stale-scan"])
    assert res.exit_code == 0, res.output
    assert sha(host.live) == image.sha256
    (line,) = host.history()
    assert line["from_sha256"] is None  # not recorded as what was replaced
    backups = host.state / "backups"
    assert not list(backups.glob("*.so")) and not list(backups.glob("*.json"))
    with pytest.raises(DeployError, match="no backup to roll back to"):
        Agent(AgentConfig(library=image.library, host_root=host.root)).rollback()
    assert sha(host.live) == image.sha256


def test_an_old_empty_backup_is_never_chosen(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    """State left by older versions: a 0-byte backup recorded as from_sha256 of the agent's deploy."""
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    host.live.write_bytes(b"")
    assert CliRunner().invoke(cli, ["--library", str(image.library), "--host-root", str(host.root), "--once",
                                    "--status-file", str(tmp_path / "s.json")]).exit_code == 0
    (host.state / "backups" / f"{empty}.so").write_bytes(b"")
    (host.state / "backups" / f"{empty}.json").write_text(json.dumps({"sha256": empty, "size": 0, "path": "x",
                                                                      "saved_at": "2026-01-01T00:00:00Z"}))
    hist = host.state / "history.jsonl"
    rec = json.loads(hist.read_text())
    rec["from_sha256"] = empty
    hist.write_text(json.dumps(rec) + "\n")
    with pytest.raises(DeployError, match="no backup to roll back to"):
        Agent(AgentConfig(library=image.library, host_root=host.root)).rollback()
    with pytest.raises(DeployError, match="no backups match"):
        Agent(AgentConfig(library=image.library, host_root=host.root)).rollback(empty[:12])


def test_status_names_the_stale_processes_pod(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    """A real process keeps the vendor file mapped across the agent's swap; status shows it with its cgroup's pod."""
    code = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('up', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code, str(host.live)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout and proc.stdout.readline().strip() == "up"
        agent = Agent(AgentConfig(library=image.library, host_root=host.root, status_file=tmp_path / "s.json"))
        snap = agent.run(once=True)
        assert proc.pid in snap.stale_host_pids or any(proc.pid in p["pids"] for p in snap.stale_pods)
        res = CliRunner().invoke(status_cli, ["--local", str(host.root), "--json"])
        assert res.exit_code == 0, res.output
        node = json.loads(res.stdout)["nodes"][0]["result"]
        assert proc.pid in node["stale_pids"]
        row = next(r for r in node["stale_processes"] if r["pid"] == proc.pid)
        assert set(row) >= {"pid", "pod_uid", "container_id", "runtime"}
        table = CliRunner().invoke(status_cli, ["--local", str(host.root)])
        assert "processes still on an old library" in table.stdout and str(proc.pid) in table.stdout
    finally:
        proc.kill()
        proc.wait()


def test_copy_back_keeps_views_consistent(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    """Hammer /healthz during repairs: every 503 carries a not-ready reason, every 200 says ready."""
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, watch="inotify", interval=30,
                              settle=0.02, status_file=tmp_path / "run" / "agent.json"))
    server = serve(agent.snapshot, 0, "127.0.0.1")
    port = server.server_address[1]
    thread = threading.Thread(target=agent.run, daemon=True)
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.append(get(f"http://127.0.0.1:{port}/healthz"))

    poller = threading.Thread(target=poll, daemon=True)
    try:
        thread.start()
        wait_for(lambda: agent.snapshot().ready)
        poller.start()
        for i in range(3):
            hami_copy_back(vendor, host.live)
            wait_for(lambda i=i: agent.snapshot().reapplies == i + 1 and agent.snapshot().ready)
    finally:
        stop.set()
        poller.join(5)
        agent.stop()
        thread.join(30)
        server.shutdown()
    assert seen
    for code, body in seen:
        assert (code, body) == (200, "ready\n") or (code == 503 and body.startswith("not ready: "))


def test_copy_back_flood_longer_than_the_settle_wait(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    """An in-place cp repeated for longer than the settle loop: no backup or from_sha256 is ever a partial file."""
    from vgpu_patch.elf.facts import image as elf_image

    agent = Agent(AgentConfig(library=image.library, host_root=host.root, watch="inotify", interval=30, settle=0.01,
                              status_file=tmp_path / "run" / "agent.json", proc=None))
    thread = threading.Thread(target=agent.run, daemon=True)
    data = vendor.read_bytes()
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            with open(host.live, "r+b") as out:  # what cp does to an existing file: truncate, then write
                out.truncate(0)
                for i in range(0, len(data), 4096):
                    out.write(data[i : i + 4096])
                    out.flush()
                    time.sleep(0.002)

    writer = threading.Thread(target=flood, daemon=True)
    try:
        thread.start()
        wait_for(lambda: agent.snapshot().ready)
        writer.start()
        time.sleep(2.0)  # 200 settle periods: far longer than the settle loop's 20
        stop.set()
        writer.join(10)
        hami_copy_back(vendor, host.live)  # the last, whole copy
        wait_for(lambda: agent.snapshot().ready and sha(host.live) == image.sha256)
    finally:
        stop.set()
        agent.stop()
        thread.join(30)
    whole = {sha(vendor), image.sha256}
    for rec in host.history():
        assert rec["from_sha256"] in whole | {None}, rec
    for so in (host.state / "backups").glob("*.so"):
        with elf_image(so, "backup"):  # a whole ELF, or this raises
            pass
        assert sha(so) in whole
    assert agent.snapshot().reapplies >= 1


def test_a_refusal_is_an_event_on_the_node(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    from fake_kube import FakeKube

    from vgpu_patch.k8s import api
    from vgpu_patch.k8s.report import NodeReporter

    shutil.copy(vendor, host.libdir / "libvgpu.so.v2.6.0")
    shutil.copy(vendor, host.libdir / "libvgpu.so.v2.7.0")
    with FakeKube() as kube:
        kube.add_node("gpu-node-1")
        agent = Agent(AgentConfig(library=image.library, host_root=host.root, proc=None,
                                  status_file=tmp_path / "s.json",
                                  reporter=NodeReporter(api.Client(kube.url), "gpu-node-1")))
        agent.step(startup=True)
        agent.step()  # the same refusal again: one event, not one per check
        (ev,) = kube.events
        assert ev["type"] == "Warning" and ev["reason"] == "VgpuPatchRefused"
        assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"}
        assert "several versioned libraries" in ev["message"] and ev["message"].endswith("(not ready)")
        assert not agent.snapshot().ready
