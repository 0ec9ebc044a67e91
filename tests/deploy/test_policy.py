"""Rollout policy: batches like Ansible's serial, a failure budget like max_fail_percentage (or a count),
pauses between batches, in-flight nodes stopping before their swap; the rollback stack; FILE checks."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from deploy_support import make_node, sha

from vgpu_patch.cli import cli
from vgpu_patch.deploy.fleet import Policy, run_fleet, stop_requested
from vgpu_patch.deploy.swap import deploy_file, rollback
from vgpu_patch.deploy.targets import HostSpec
from vgpu_patch.report.errors import DeployError, StopRequested, UsageError
from vgpu_patch.transport.local import LocalTransport

DIR = "/usr/local/vgpu"


@pytest.mark.parametrize("sizes,n,expected", [
    ("1,10%,50%", 20, [1, 2, 10, 7]),
    ("1,10%,50%", 100, [1, 10, 50, 39]),
    ("2", 5, [2, 2, 1]),
    ("10%", 5, [1, 1, 1, 1, 1]),  # rounded down, at least 1 (Ansible)
    ("100%", 7, [7]),
])
def test_batches_like_ansible_serial(sizes: str, n: int, expected: list[int]) -> None:
    p = Policy.from_options(n=n, batch=sizes, canary=None, max_fail=None, keep_going=False)
    assert [len(b) for b in p.plan(n)] == expected


@pytest.mark.parametrize("bad", ["0", "x", "1,,-2", "150%"])
def test_bad_batch_or_budget_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        Policy.from_options(n=5, batch=bad, canary=None, max_fail=None, keep_going=False)
    if bad != "0":
        with pytest.raises(UsageError):
            Policy.from_options(n=5, batch=None, canary=None, max_fail=bad, keep_going=False)


def _specs(n: int) -> list[HostSpec]:
    return [HostSpec(name=f"n{i}") for i in range(n)]


def _fake(fail: set[int], log: list[str], delay: float = 0.0):
    def op(t, spec):  # type: ignore[no-untyped-def]
        i = int(spec.name[1:])
        time.sleep(delay)
        if stop_requested():
            raise StopRequested(f"{spec.name}: stopping")
        if i in fail:
            raise DeployError(f"{spec.name}: broken")
        log.append(spec.name)
        return "changed", None
    return op


def _statuses(res) -> list[str]:  # type: ignore[no-untyped-def]
    return [o.status for o in res.outcomes]


def test_percent_budget_is_judged_per_batch() -> None:
    log: list[str] = []
    # 10 nodes, batches 5 + 5; one failure in the first batch = 20% <= 25%: carry on
    p = Policy.from_options(n=10, batch="5", canary=None, max_fail="25%", keep_going=False)
    res = run_fleet(_specs(10), _fake({1}, log), lambda s: LocalTransport("/"), parallel=5, policy=p)
    assert _statuses(res).count("failed") == 1 and _statuses(res).count("changed") == 9
    # two failures in the first batch = 40% > 25%: the batch finishes, the next never starts
    log.clear()
    res = run_fleet(_specs(10), _fake({1, 2}, log), lambda s: LocalTransport("/"), parallel=5, policy=p)
    assert _statuses(res)[:5].count("failed") == 2 and _statuses(res)[5:] == ["skipped"] * 5


def test_count_budget_and_in_flight_nodes_stop_before_their_swap() -> None:
    log: list[str] = []
    p = Policy.from_options(n=8, batch=None, canary=0, max_fail="1", keep_going=False)
    res = run_fleet(_specs(8), _fake({0, 1}, log, delay=0.05), lambda s: LocalTransport("/"), parallel=1, policy=p)
    assert _statuses(res)[:2] == ["failed", "failed"] and set(_statuses(res)[2:]) == {"skipped"}
    # default budget 0, 4 at once: n0 fails fast; n1..n3 are in flight and stop at their checkpoint
    log.clear()

    def op(t, spec):  # type: ignore[no-untyped-def]
        if spec.name == "n0":
            raise DeployError("n0: broken")
        time.sleep(0.2)  # still before the swap when n0 fails
        if stop_requested():
            raise StopRequested(f"{spec.name}: not changed: stopping")
        log.append(spec.name)
        return "changed", None

    p = Policy.from_options(n=8, batch=None, canary=0, max_fail=None, keep_going=False)
    res = run_fleet(_specs(8), op, lambda s: LocalTransport("/"), parallel=4, policy=p)
    assert log == [] and _statuses(res) == ["failed"] + ["skipped"] * 7


def test_pause_between_batches() -> None:
    slept: list[float] = []
    p = Policy.from_options(n=4, batch="1,50%", canary=None, max_fail=None, keep_going=False, pause_between=7)
    res = run_fleet(_specs(4), _fake(set(), []), lambda s: LocalTransport("/"), policy=p, sleep=slept.append)
    assert _statuses(res) == ["changed"] * 4 and slept == [7, 7]  # batches 1, 2, 1: two gaps


def test_rollback_walks_the_stack_back(tmp_path: Path, libs) -> None:
    root = tmp_path / "root"
    d = make_node(root, libs["vendor"])
    t = LocalTransport(root)
    deploy_file(t, libs["v1"], DIR, operator="a")
    deploy_file(t, libs["v2"], DIR, operator="a")
    seen = []
    for _ in range(2):
        rollback(t, DIR, operator="a")
        seen.append(sha(d / "libvgpu.so"))
    assert seen == [sha(libs["v1"]), sha(libs["vendor"])]  # v2 -> v1 -> vendor, no toggling
    with pytest.raises(DeployError, match="no earlier file"):
        rollback(t, DIR, operator="a")
    deploy_file(t, libs["v1"], DIR, operator="a")
    deploy_file(t, libs["v2"], DIR, operator="a")
    deploy_file(t, libs["v3"], DIR, operator="a")
    assert rollback(t, DIR, to_sha256="vendor", operator="a").to_sha256 == sha(libs["vendor"])
    deploy_file(t, libs["v3"], DIR, operator="a")
    r = rollback(t, DIR, to_sha256=sha(libs["v1"])[:10], operator="a")
    assert r.to_sha256 == sha(libs["v1"])
    # v1 was not on the stack (vendor only): restoring it was a swap like a deploy, so previous is v3
    assert rollback(t, DIR, operator="a").to_sha256 == sha(libs["v3"])
    assert rollback(t, DIR, operator="a").to_sha256 == sha(libs["vendor"])


def test_the_rollback_stack_skips_an_old_empty_backup(tmp_path: Path, libs) -> None:
    """State left by older versions: a 0-byte backup recorded as from_sha256 is never on the stack nor --to."""
    root = tmp_path / "root"
    d = make_node(root, libs["vendor"])
    t = LocalTransport(root)
    deploy_file(t, libs["v1"], DIR, operator="a")
    deploy_file(t, libs["v2"], DIR, operator="a")
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    state = d / ".vgpu-patch"
    (state / "backups" / f"{empty}.so").write_bytes(b"")
    (state / "backups" / f"{empty}.json").write_text(json.dumps({"sha256": empty, "size": 0, "path": "x",
                                                                  "saved_at": "2026-01-01T00:00:00Z"}))
    lines = (state / "history.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["from_sha256"] = empty  # the v2 deploy "replaced" an empty file
    (state / "history.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    with pytest.raises(DeployError, match="no backups match"):
        rollback(t, DIR, to_sha256=empty[:12], operator="a")
    assert rollback(t, DIR, operator="a").to_sha256 == sha(libs["vendor"])  # the empty one is skipped
    assert sha(d / "libvgpu.so") == sha(libs["vendor"])


def test_expect_sha256_and_build_manifest(tmp_path: Path, libs) -> None:
    root = tmp_path / "root"
    make_node(root, libs["vendor"])
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(libs["v1"].read_bytes())
    base = ["deploy", "--no-check", "--local", str(root), "--json"]
    res = CliRunner().invoke(cli, [*base, "--expect-sha256", "0" * 64, str(lib)])
    assert res.exit_code == 1 and "not --expect-sha256" in str(res.exception)
    (tmp_path / "libvgpu.so.json").write_text(json.dumps({"sha256": sha(libs["v2"])}))
    res = CliRunner().invoke(cli, [*base, str(lib)])
    assert res.exit_code == 1 and "build manifest" in str(res.exception)
    (tmp_path / "libvgpu.so.json").write_text(json.dumps({"sha256": sha(libs["v1"])}))
    res = CliRunner().invoke(cli, [*base, "--expect-sha256", sha(libs["v1"]).upper(), str(lib)])
    assert res.exit_code == 0, res.output


def test_dry_run_json_carries_the_exact_commands(tmp_path: Path, libs) -> None:
    root = tmp_path / "root"
    make_node(root, libs["vendor"])
    args = ["deploy", "--no-check", "--local", str(root), "--dry-run", "--json", str(libs["v1"])]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1
    plan = json.loads(res.stdout)["nodes"][0]["result"]["plan"]
    kinds = [s["kind"] for s in plan]
    assert kinds[0] == "prepare" and "swap" in kinds and kinds[-1] == "report"
    swap = next(s for s in plan if s["kind"] == "swap")
    assert swap["sh"] == "swap_in" and 'mv -f "$TMP" "$LIVE"' in swap["code"]


def test_bad_batch_through_the_cli_is_a_usage_error(tmp_path: Path, libs) -> None:
    root = tmp_path / "r"
    make_node(root, libs["vendor"])
    res = CliRunner().invoke(cli, ["deploy", "--no-check", "--local", str(root), "--batch", "0", str(libs["v1"])])
    assert isinstance(res.exception, UsageError) and "--batch '0'" in str(res.exception)
    res = CliRunner().invoke(cli, ["rollback", "--local", str(root), "--yes", "--max-fail", "x"])
    assert isinstance(res.exception, UsageError) and "--max-fail" in str(res.exception)
