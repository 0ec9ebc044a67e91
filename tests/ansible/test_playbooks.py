"""deploy.yml / rollback.yml / status.yml with real ansible-playbook over real sshd on 127.0.0.1."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from fleet_helpers import Libs, Node, run_playbook, write_inventory
from node_fixtures import sha

ALL_AT_ONCE = {"vgpu_patch_serial": "100%"}  # one batch: faster where batching is not under test


def assert_clean(node: Node) -> None:
    """No lock dir, staged file or temp file left behind (staging/ is only an older version's)."""
    assert not (node.state / "lock.d").exists()
    assert not (node.state / "staging").exists() or list((node.state / "staging").iterdir()) == []
    assert [p.name for p in node.libdir.iterdir() if p.name.startswith(("tmp", ".ansible_tmp", ".libvgpu"))] == []


def test_deploy_rerun_status_rollback(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    versioned, plain, _ = nodes
    shutil.copy(libs.vendor, versioned.libdir / "libvgpu.so.2.5.0")
    os.chmod(versioned.libdir / "libvgpu.so.2.5.0", 0o755)
    (versioned.libdir / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")  # HAMi's own line
    shutil.copy(libs.vendor, plain.libdir / "libvgpu.so")
    os.chmod(plain.libdir / "libvgpu.so", 0o644)
    inv = write_inventory([versioned, plain], tmp_path / "inv.ini")
    vendor_sha, v2_sha = sha(libs.vendor), sha(libs.v2)

    run = run_playbook("deploy.yml", inv, {**ALL_AT_ONCE, "vgpu_patch_library": str(libs.v2),
                                           "vgpu_patch_library_sha256": v2_sha})
    assert run.rc == 0, run.output
    live = {versioned.name: versioned.libdir / "libvgpu.so.2.5.0", plain.name: plain.libdir / "libvgpu.so"}
    for node in (versioned, plain):
        assert sha(live[node.name]) == v2_sha and run.changed(node) > 0
        assert_clean(node)
        (line,) = node.history()
        assert (line["action"], line["tool"], line["from_sha256"], line["to_sha256"]) == \
            ("deploy", "ansible", vendor_sha, v2_sha)
        assert line["path"] == str(live[node.name]) and line["time"].endswith("Z") and "@" in line["operator"]
        assert (node.state / "backups" / f"{vendor_sha}.so").read_bytes() == libs.vendor.read_bytes()
        doc = json.loads((node.state / "backups" / f"{vendor_sha}.json").read_text())
        assert doc["sha256"] == vendor_sha and doc["size"] == libs.vendor.stat().st_size and doc["tool"] == "ansible"
    assert not (versioned.libdir / "libvgpu.so").exists()  # the versioned file is the live one
    assert oct(live[versioned.name].stat().st_mode & 0o777) == "0o755"  # mode kept

    again = run_playbook("deploy.yml", inv, {**ALL_AT_ONCE, "vgpu_patch_library": str(libs.v2)})
    assert again.rc == 0, again.output
    assert (again.changed(versioned), again.changed(plain)) == (0, 0)
    assert len(versioned.history()) == len(plain.history()) == 1

    status = run_playbook("status.yml", inv, limit=versioned.name)
    assert status.rc == 0 and status.changed(versioned) == 0, status.output
    assert v2_sha in status.output and "vgpu-patch-shim 0.2.0" in status.output

    back = run_playbook("rollback.yml", inv, limit=versioned.name)
    assert back.rc == 0, back.output
    assert live[versioned.name].read_bytes() == libs.vendor.read_bytes()  # byte-identical
    last = versioned.history()[-1]
    assert (last["action"], last["from_sha256"], last["to_sha256"]) == ("rollback", v2_sha, vendor_sha)
    assert (versioned.state / "backups" / f"{v2_sha}.so").read_bytes() == libs.v2.read_bytes()  # roll-forward kept
    assert_clean(versioned)

    # What Ansible deployed, the CLI rolls back (same state files, same lock).
    swap = pytest.importorskip("vgpu_patch.deploy.swap")
    from vgpu_patch.transport.local import LocalTransport

    res = swap.rollback(LocalTransport(plain.root), "/usr/local/vgpu", operator="test@cli")
    assert res.changed and res.to_sha256 == vendor_sha
    assert live[plain.name].read_bytes() == libs.vendor.read_bytes()
    assert plain.history()[-1]["tool"].startswith("vgpu-patch")


def test_cli_deploy_rolled_back_by_ansible_after_a_dead_run(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    swap = pytest.importorskip("vgpu_patch.deploy.swap")
    from vgpu_patch.transport.local import LocalTransport

    node = nodes[0]
    shutil.copy(libs.vendor, node.libdir / "libvgpu.so")
    res = swap.deploy_file(LocalTransport(node.root), libs.v1, "/usr/local/vgpu", operator="test@cli")
    assert res.changed and sha(node.libdir / "libvgpu.so") == sha(libs.v1)
    (node.libdir / ".libvgpu.so.vgpu-patch-tmp.12345").write_bytes(b"half")  # a SIGKILLed run's temp file
    (node.state / "staging").mkdir()  # an older version's staging area, with a SIGKILLed run's part file
    (node.state / "staging" / "x.so.part.12345").write_bytes(b"half")
    inv = write_inventory([node], tmp_path / "inv.ini")

    run = run_playbook("rollback.yml", inv)
    assert run.rc == 0, run.output
    assert (node.libdir / "libvgpu.so").read_bytes() == libs.vendor.read_bytes()
    first, last = node.history()
    assert first["tool"].startswith("vgpu-patch")
    assert last["tool"] == "ansible" and last["to_sha256"] == sha(libs.vendor)
    assert_clean(node)


def test_rollback_walks_back_and_blames_nobody_else(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    node = nodes[0]
    shutil.copy(libs.vendor, node.libdir / "libvgpu.so")
    inv = write_inventory([node], tmp_path / "inv.ini")
    for lib in (libs.v1, libs.v2):
        run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(lib)})
        assert run.rc == 0, run.output
    seen = []
    for _ in range(2):
        run = run_playbook("rollback.yml", inv)
        assert run.rc == 0, run.output
        seen.append(sha(node.libdir / "libvgpu.so"))
    assert seen == [sha(libs.v1), sha(libs.vendor)]
    run = run_playbook("rollback.yml", inv)
    assert run.rc != 0 and "no earlier file to roll back to" in run.output
    assert sha(node.libdir / "libvgpu.so") == sha(libs.vendor)


def test_candidate_failing_the_load_test_stops_at_the_canary(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    for n in nodes:
        shutil.copy(libs.vendor, n.libdir / "libvgpu.so")
    inv = write_inventory(nodes, tmp_path / "inv.ini")
    run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(libs.not_elf)})  # serial [1, 25%]
    assert run.rc != 0
    assert "LD_PRELOAD of the new file" in run.output and "cannot be preloaded" in run.output
    canary, *rest = nodes
    assert run.failed(canary) == 1
    assert all(n.name not in run.recap for n in rest), run.output  # later batches never started
    for n in nodes:
        assert (n.libdir / "libvgpu.so").read_bytes() == libs.vendor.read_bytes()
        assert n.history() == []
    assert_clean(canary)
    assert not rest[0].state.exists()


def test_failing_node_stops_the_rollout(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    first, broken, last = nodes  # first: a node with no library yet (fresh install)
    for n in (broken, last):
        shutil.copy(libs.vendor, n.libdir / "libvgpu.so.2.5.0")
    shutil.copy(libs.v1, broken.libdir / "libvgpu.so.2.4.0")  # two versioned files: ambiguous
    inv = write_inventory(nodes, tmp_path / "inv.ini")
    # Batches of 2 then 1: the broken node fails beside a healthy one. Ansible's own max_fail_percentage (0)
    # stops the rollout; the healthy node is not blamed for it.
    run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(libs.v2), "vgpu_patch_serial": [2, 1]})
    assert run.rc != 0
    assert "several versioned libraries" in run.output
    assert sha(first.libdir / "libvgpu.so") == sha(libs.v2)  # its swap completed before the stop
    assert first.history()[0]["from_sha256"] is None
    assert_clean(first)
    assert run.failed(first) == 0 and run.failed(broken) == 1
    assert sha(broken.libdir / "libvgpu.so.2.5.0") == sha(libs.vendor)
    assert not (broken.state / "lock.d").exists()
    assert last.name not in run.recap and not last.state.exists()


def test_lock_held_by_another_deploy_is_respected(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    node = nodes[0]
    shutil.copy(libs.vendor, node.libdir / "libvgpu.so")
    (node.state / "backups").mkdir(parents=True)
    inv = write_inventory([node], tmp_path / "inv.ini")
    with open(node.state / "lock", "a") as lock:  # what the CLI holds during its swap
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(libs.v2)})
    assert run.rc != 0 and "holds the lock" in run.output
    assert (node.libdir / "libvgpu.so").read_bytes() == libs.vendor.read_bytes()
    assert not (node.state / "lock.d").exists()
    run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(libs.v2)})  # the holder is gone
    assert run.rc == 0, run.output and sha(node.libdir / "libvgpu.so") == sha(libs.v2)


def test_wrong_expected_sha256_touches_no_node(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    inv = write_inventory(nodes, tmp_path / "inv.ini")
    run = run_playbook("deploy.yml", inv, {"vgpu_patch_library": str(libs.v2), "vgpu_patch_library_sha256": "0" * 64})
    assert run.rc != 0 and "no node was touched" in run.output
    assert all(not n.state.exists() for n in nodes)
