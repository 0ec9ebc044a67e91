"""The CLI over fleets of real sshd nodes and the local target: exit codes, canary, stop/keep-going, --json."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from deploy_support import NO_SUDO, make_node, sha
from sshd_harness import SSHD, known_hosts_file, start_many

from vgpu_patch.cli import cli


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    from sshd_harness import available

    if available():
        pytest.skip(available())
    base = tmp_path_factory.mktemp("fleet")
    servers = start_many(3, base)
    yield base, servers
    for s in servers:
        s.stop()


def setup_nodes(base: Path, servers: list[SSHD], lib: Path, missing: set[int] = frozenset()) -> tuple[Path, list[Path]]:
    """Fresh library dirs per node (one per sshd, as they share this machine) and an inventory naming them."""
    dirs = []
    lines = ["[gpu]"]
    for i, s in enumerate(servers):
        d = base / f"lib{i}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        if i not in missing:
            shutil.copyfile(lib, d / "libvgpu.so")
        dirs.append(d)
        lines.append(f"{s.alias} {s.inventory_vars()} vgpu_patch_target_dir={d}")
    inv = base / "hosts.ini"
    inv.write_text("\n".join(lines) + "\n")
    known_hosts_file(servers, base / "known_hosts")
    return inv, dirs


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input)


def test_fleet_deploy_rerun_dry_run_status_rollback(fleet, libs) -> None:
    base, servers = fleet
    inv, dirs = setup_nodes(base, servers, libs["vendor"])
    common = [*NO_SUDO, "-I", str(inv), "--known-hosts", str(base / "known_hosts")]
    res = run("deploy", "--no-check", *common, "--json", str(libs["v1"]))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # exactly one JSON document
    assert doc["counts"] == {"changed": 3} and doc["sha256"] == sha(libs["v1"])
    assert all((d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes() for d in dirs)
    res = run("deploy", "--no-check", *common, "--json", str(libs["v1"]))
    assert res.exit_code == 0 and json.loads(res.stdout)["counts"] == {"unchanged": 3}
    res = run("deploy", "--no-check", *common, "--dry-run", "--json", str(libs["v2"]))
    assert res.exit_code == 1 and json.loads(res.stdout)["counts"] == {"pending": 3}
    assert all((d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes() for d in dirs)
    res = run("deploy", "--no-check", *common, "--dry-run", str(libs["v1"]))
    assert res.exit_code == 0, res.output

    res = run("status", *common, "--json")
    assert res.exit_code == 0, res.output
    nodes = json.loads(res.stdout)["nodes"]
    assert [n["result"]["sha256"] for n in nodes] == [sha(libs["v1"])] * 3
    assert all(n["result"]["ours"] and n["result"]["version"] == "0.1.0" for n in nodes)
    res = run("status", *common)
    assert res.exit_code == 0 and "ours 0.1.0" in res.stdout

    res = run("rollback", *common, "--limit", servers[0].alias, input="n\n")
    assert res.exit_code == 1 and (dirs[0] / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    res = run("rollback", *common, "--limit", servers[0].alias, "--yes", "--json")
    assert res.exit_code == 0, res.output
    assert (dirs[0] / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert (dirs[1] / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()


def test_fleet_stops_at_first_failure(fleet, libs) -> None:
    base, servers = fleet
    inv, dirs = setup_nodes(base, servers, libs["vendor"], missing={1})
    common = [*NO_SUDO, "-I", str(inv), "--known-hosts", str(base / "known_hosts"), "--parallel", "1"]
    res = run("deploy", "--no-check", *common, "--json", str(libs["v2"]))
    assert res.exit_code == 3, res.output
    statuses = [n["status"] for n in json.loads(res.stdout)["nodes"]]
    assert statuses == ["changed", "failed", "skipped"]
    err = json.loads(res.stdout)["nodes"][1]["error"]
    assert "--install" in err and "\n" not in err
    assert (dirs[2] / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    res = run("deploy", "--no-check", *common, "--keep-going", "--json", str(libs["v2"]))
    assert res.exit_code == 3
    assert [n["status"] for n in json.loads(res.stdout)["nodes"]] == ["unchanged", "failed", "changed"]


def test_failed_canary_stops_everything(fleet, libs) -> None:
    base, servers = fleet
    inv, dirs = setup_nodes(base, servers, libs["vendor"], missing={0})
    res = run("deploy", "--no-check", *NO_SUDO, "-I", str(inv), "--known-hosts", str(base / "known_hosts"), "--json",
              str(libs["v2"]))
    assert res.exit_code == 1, res.output
    assert [n["status"] for n in json.loads(res.stdout)["nodes"]] == ["failed", "skipped", "skipped"]
    assert all((d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes() for d in dirs[1:])


def test_unknown_host_key_via_cli_is_one_line(fleet, libs, tmp_path: Path) -> None:
    base, servers = fleet
    inv, _ = setup_nodes(base, servers[:1], libs["vendor"])
    res = run("deploy", "--no-check", *NO_SUDO, "-I", str(inv), "--known-hosts", str(tmp_path / "empty"), "--json",
              str(libs["v1"]))
    assert res.exit_code == 1
    node = json.loads(res.stdout)["nodes"][0]
    assert node["error_type"] == "HostKeyError" and "--accept-new-host-keys" in node["error"]
    res = run("deploy", "--no-check", *NO_SUDO, "-I", str(inv), "--known-hosts", str(tmp_path / "kh"),
              "--accept-new-host-keys", str(libs["v1"]))
    assert res.exit_code == 0, res.output


def test_local_demo_and_usage_errors(tmp_path: Path, libs) -> None:
    root = tmp_path / "node"
    d = make_node(root, libs["vendor"])
    res = run("deploy", "--no-check", "--local", str(root), str(libs["v1"]))
    assert res.exit_code == 0, res.output
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    res = run("status", "--local", str(root), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["nodes"][0]["result"]["version"] == "0.1.0"
    for args, words in ([[str(libs["v1"])], "no target"], [["--host", "a@b@c", str(libs["v1"])], "expected user@node"]):
        proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "deploy", *args], capture_output=True, text=True)
        assert proc.returncode == 2 and words in proc.stderr and proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_dry_run_prints_the_plan_and_exits_1(tmp_path: Path, libs) -> None:
    root = tmp_path / "node"
    d = make_node(root, libs["vendor"])
    res = run("deploy", "--no-check", "--local", str(root), "--dry-run", str(libs["v1"]))
    assert res.exit_code == 1, res.output
    assert "pending" in res.stdout and "back up /usr/local/vgpu/libvgpu.so" in res.stdout
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    res = run("rollback", "--local", str(root), "--yes")
    assert res.exit_code == 1 and "no backup to roll back to" in res.stdout


def test_dry_run_plan_is_numbered_steps_per_node(tmp_path: Path, libs) -> None:
    """As `terraform plan` / `ansible --check` show it: the node, then its steps in order, no table cell of
    prose; the texts are --json's plan; -v adds each step's shell (what the swap script is made of)."""
    root = tmp_path / "node"
    make_node(root, libs["vendor"])
    args = ["deploy", "--no-check", "--local", str(root), "--dry-run", str(libs["v1"])]
    doc = json.loads(run(*args, "--json").stdout)
    plan = [st for st in doc["nodes"][0]["result"]["plan"] if st["kind"] not in ("prepare", "report")]
    res = run(*args)
    assert res.exit_code == 1 and "┃" not in res.stdout and "│" not in res.stdout
    lines = res.stdout.splitlines()
    assert lines[2] == (f"local:{root}: pending, {sha(libs['vendor'])[:12]} -> {sha(libs['v1'])[:12]} "
                        "(/usr/local/vgpu/libvgpu.so)")
    numbered = [ln for ln in lines if ln[:5].strip().rstrip(".").isdigit()]
    assert [int(ln.split(".")[0]) for ln in numbered] == list(range(1, len(plan) + 1))
    joined = " ".join(res.stdout.split())
    for i, st in enumerate(plan, 1):
        assert f"{i}. {st['kind']} {' '.join(st['text'].split())}" in joined
    assert lines[-1].startswith("pending: 1")
    verbose = run(*args, "-v").stdout
    for st in doc["nodes"][0]["result"]["plan"]:
        for sh_line in st["sh"].splitlines():
            assert f"| {sh_line}" in verbose


def test_max_fail_and_batches_over_real_nodes(fleet, libs) -> None:
    base, servers = fleet
    inv, dirs = setup_nodes(base, servers, libs["vendor"], missing={0, 1})
    common = [*NO_SUDO, "-I", str(inv), "--known-hosts", str(base / "known_hosts"), "--parallel", "1", "--json"]
    res = run("deploy", "--no-check", *common, "--canary", "0", "--max-fail", "1", str(libs["v2"]))
    assert res.exit_code == 1, res.output  # no node reached the wanted state
    assert [n["status"] for n in json.loads(res.stdout)["nodes"]] == ["failed", "failed", "skipped"]
    # batches 1, 2: the first batch fails entirely (100% > 50%): the second never starts
    res = run("deploy", "--no-check", *common, "--batch", "1,2", "--max-fail", "50%", str(libs["v2"]))
    assert [n["status"] for n in json.loads(res.stdout)["nodes"]] == ["failed", "skipped", "skipped"]
    inv, dirs = setup_nodes(base, servers, libs["vendor"], missing={1})
    res = run("deploy", "--no-check", *common, "--batch", "1,2", "--max-fail", "50%", str(libs["v2"]))
    assert res.exit_code == 3, res.output
    assert [n["status"] for n in json.loads(res.stdout)["nodes"]] == ["changed", "failed", "changed"]
    assert (dirs[2] / "libvgpu.so").read_bytes() == libs["v2"].read_bytes()
