"""The node agent and the live file: the corpus of tests/live_corpus.py (`agent --once`), and a copy-back counted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import Host, Image, hami_copy_back, sha, wait_for
from click.testing import CliRunner
from live_corpus import CASES, Case, check_outcome, lay_out, mapping, snapshot

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.agent.metrics import render
from vgpu_patch.commands.agent import cli


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_agent_installs_into_the_file_hami_mounts(case: Case, image: Image, vendor: Path, tmp_path: Path) -> None:
    root = tmp_path / "host"
    libdir = root / "usr/local/vgpu"
    lay_out(case, libdir, vendor)
    before = snapshot(libdir)
    with mapping(case, libdir):
        res = CliRunner().invoke(cli, ["--library", str(image.library), "--host-root", str(root), "--target-dir",
                                       "/usr/local/vgpu", "--once", "--json", "--status-file", str(tmp_path / "s")])
    out = res.output + str(res.exception or "")
    check_outcome(case, before, libdir, image.library.read_bytes(), res.exit_code == 0, out)
    if case.refuse is None:
        assert json.loads(res.stdout)["live_path"] == f"/usr/local/vgpu/{case.live}"


@pytest.mark.watch("inotify", 30.0)
def test_copy_back_is_counted_and_named(running: Agent, image: Image, host: Host, vendor: Path) -> None:
    assert running.snapshot().copy_backs == 0
    hami_copy_back(vendor, host.live)  # the plugin's restart: a plain cp over our file
    wait_for(lambda: running.snapshot().reapplies == 1 and sha(host.live) == image.sha256)
    assert running.snapshot().copy_backs == 1
    assert "\nvgpu_patch_agent_copy_backs_total 1\n" in render(running.snapshot())


def test_a_repair_probes_the_node_once(image: Image, host: Host, vendor: Path, tmp_path: Path) -> None:
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, status_file=tmp_path / "s.json", proc=None))
    calls: list[str] = []
    run, open_stream = agent.t.run, agent.t.open_stream

    def counted_run(cmd: str, **kw: object):  # type: ignore[no-untyped-def]
        calls.append("run")
        return run(cmd, **kw)  # type: ignore[arg-type]

    def counted_stream(cmd: str, **kw: object):  # type: ignore[no-untyped-def]
        calls.append("session")
        return open_stream(cmd, **kw)  # type: ignore[arg-type]

    agent.t.run, agent.t.open_stream = counted_run, counted_stream  # type: ignore[method-assign]
    assert agent.step(startup=True) == "deploy" and sha(host.live) == image.sha256
    hami_copy_back(vendor, host.live)
    assert agent.step() == "reapply" and sha(host.live) == image.sha256
    assert agent.step() == "ok"
    assert calls == ["session", "session", "session"]  # one probe per pass, the swap in the same session
