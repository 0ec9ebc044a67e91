"""The live-file rule through the CLI (`deploy --local`, `status --local`): the corpus of tests/live_corpus.py,
plus the evidence only a probe can be shown here (a running plugin's image, under a fake /proc)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from live_corpus import CASES, LEFTOVERS, Case, check_outcome, lay_out, mapping, snapshot

from vgpu_patch.deploy import facts as F
from vgpu_patch.transport.local import LocalTransport

REPO = Path(__file__).resolve().parents[2]


def vgpu(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_deploy_swaps_the_file_hami_mounts(case: Case, tmp_path: Path, libs: dict[str, Path]) -> None:
    libdir = tmp_path / "usr/local/vgpu"
    lay_out(case, libdir, libs["vendor"])
    before = snapshot(libdir)
    with mapping(case, libdir):
        status = vgpu("status", "--local", str(tmp_path), "--json")
        run = vgpu("deploy", "--local", str(tmp_path), "--no-check", "--json", str(libs["v1"]))
    check_outcome(case, before, libdir, libs["v1"].read_bytes(), run.returncode == 0, run.stdout + run.stderr)
    (node,) = json.loads(status.stdout)["nodes"]
    st = node["result"]
    if case.refuse is None:
        assert st["path"] == f"/usr/local/vgpu/{case.live}" and st["live_why"], st
        assert sorted(st["other_files"]) == sorted(n for n in (*case.files, *case.links) if n != case.live)
    else:
        assert case.refuse in (st["problem"] or ""), st


def test_is_version_accepts_versions_and_never_a_leftover(tmp_path: Path) -> None:
    good = ["v2.6.0", "2.6.0", "v2.6.0-rc1", "1", "v2.7.1-beta2", "2.6.0-5-gabc123"]
    bad = [s.lstrip(".") for s in LEFTOVERS] + ["", "v", ".2", "2..6", "2.6.", "v2.6.0-", "v2.6.0-rc.1", "x2.6"]
    script = F.node_program() + "".join(f"is_version '{s}' && echo 'yes {s}' || echo 'no {s}'\n" for s in good + bad)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout.splitlines()
    assert out == [f"yes {s}" for s in good] + [f"no {s}" for s in bad]


def _plugin_proc(tmp_path: Path, version: str) -> Path:
    """A fake /proc holding a device plugin process whose image carries libvgpu.so.<version>."""
    proc = tmp_path / "proc"
    d = proc / "4242" / "root" / "k8s-vgpu" / "lib" / "nvidia"
    d.mkdir(parents=True)
    (d / f"libvgpu.so.{version}").write_bytes(b"\x7fELF")
    (proc / "1" / "root").mkdir(parents=True)  # a host process: no plugin image
    return proc


def test_the_running_plugin_decides_between_two_versions(tmp_path: Path, libs: dict[str, Path]) -> None:
    root = tmp_path / "root"
    case = Case("upgrade", ("libvgpu.so.v2.5.0", "libvgpu.so.v2.6.0"), live="libvgpu.so.v2.6.0",
                preload="/usr/local/vgpu/libvgpu.so.v2.5.0\n")  # the plugin's word outranks a stale preload
    lay_out(case, root / "usr/local/vgpu", libs["vendor"])
    t = LocalTransport(root)
    probe = F.probe_script(t.path("/usr/local/vgpu"), maps=False, proc=str(_plugin_proc(tmp_path, "v2.6.0")))
    facts = F.parse(t.run(probe).stdout, "/usr/local/vgpu")
    assert facts.live_name is None and "ld.so.preload names /usr/local/vgpu/libvgpu.so.v2.5.0" in facts.live_why
    (root / "usr/local/vgpu/ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    facts = F.parse(t.run(probe).stdout, "/usr/local/vgpu")
    assert facts.live_name == "libvgpu.so.v2.6.0"
    assert "the running device plugin (pid 4242) carries libvgpu.so.v2.6.0" in facts.live_why
    assert F.other_files(facts) == ["libvgpu.so.v2.5.0"]
