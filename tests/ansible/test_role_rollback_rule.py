"""One rollback rule: the CLI (`rollback`, over a local node) and the Ansible role (rollback.yml) restore the same
backup, or refuse with the same reason, on the same node states: the live-file corpus of tests/live_corpus.py after
two deploys, plus states with no (usable) history. Both run node.sh's `choose_backup`; this holds them to it."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from fleet_helpers import Libs, Node, _ini_quote, run_playbook
from live_corpus import CASES, lay_out
from node_fixtures import sha

from vgpu_patch.deploy.swap import deploy_file, rollback
from vgpu_patch.report.errors import VgpuPatchError
from vgpu_patch.transport.local import LocalTransport

DIR = "/usr/local/vgpu"


def _deploys(root: Path, *libs: Path) -> None:
    t = LocalTransport(root)
    for lib in libs:
        try:
            deploy_file(t, lib, DIR, operator="t", install=True)
        except VgpuPatchError:
            return  # an ambiguous directory: both front ends must refuse its rollback too


def _backups(root: Path) -> Path:
    return root / "usr/local/vgpu/.vgpu-patch/backups"


def _set_saved_at(root: Path) -> None:
    """Distinct, ordered saved_at times (a test's deploys share one second)."""
    for i, j in enumerate(sorted(_backups(root).glob("*.json"), key=lambda p: json.loads(p.read_text())["saved_at"])):
        doc = json.loads(j.read_text())
        doc["saved_at"] = f"2026-01-0{i + 1}T00:00:00Z"
        j.write_text(json.dumps(doc) + "\n")


LIVE_REFUSALS: dict[str, str] = {}  # state -> the live-file rule's refusal both must give (not a rollback choice)


def _states(tmp: Path, libs: Libs) -> list[tuple[str, Path, str]]:
    """(name, node root, --to) for every case: the corpus after two deploys, and the no-history cases."""
    out = []
    for case in CASES:
        root = tmp / "states" / case.id
        lay_out(case, root / "usr/local/vgpu", libs.vendor)
        _deploys(root, libs.v1, libs.v2)
        out += [(f"{case.id}-previous", root, "previous"), (f"{case.id}-vendor", root, "vendor")]
        if case.refuse is not None:
            LIVE_REFUSALS.update({f"{case.id}-previous": case.refuse, f"{case.id}-vendor": case.refuse})

    def fresh(name: str, *deploys: Path) -> Path:
        root = tmp / "states" / name
        (root / "usr/local/vgpu").mkdir(parents=True)
        shutil.copyfile(libs.vendor, root / "usr/local/vgpu/libvgpu.so")
        _deploys(root, *deploys)
        _set_saved_at(root)
        return root

    state = Path("usr/local/vgpu/.vgpu-patch")
    one = fresh("one-backup-no-history", libs.v1)
    (one / state / "history.jsonl").unlink()
    out += [("one-backup-no-history", one, "previous"), ("one-backup-no-history-vendor", one, "vendor")]
    two = fresh("two-backups-no-history", libs.v1, libs.v2)
    (two / state / "history.jsonl").unlink()
    out += [("two-backups-no-history", two, "previous")]
    none = tmp / "states" / "no-backup"
    (none / "usr/local/vgpu").mkdir(parents=True)
    shutil.copyfile(libs.vendor, none / "usr/local/vgpu/libvgpu.so")
    out += [("no-backup-no-history", none, "previous")]
    gone = fresh("history-names-no-kept-file", libs.v1, libs.v2)  # the files it recorded are gone, one is kept
    hist = [json.loads(x) for x in (gone / state / "history.jsonl").read_text().splitlines()]
    for h in hist:
        (_backups(gone) / f"{h['from_sha256']}.so").unlink(missing_ok=True)
        (_backups(gone) / f"{h['from_sha256']}.json").unlink(missing_ok=True)
    shutil.copyfile(libs.v1, _backups(gone) / "hand.so")  # not a backup: no manifest, never listed
    out += [("history-names-no-kept-file", gone, "previous")]
    empty = fresh("empty-backup-on-the-stack", libs.v1, libs.v2)
    (_backups(empty) / f"{sha(libs.v1)}.so").write_bytes(b"")  # an older version's empty backup
    out += [("empty-backup-previous", empty, "previous"), ("empty-backup-by-sha", empty, sha(libs.v1)[:8]),
            ("empty-backup-vendor", empty, "vendor")]
    missing = fresh("missing-backup", libs.v1, libs.v2)
    (_backups(missing) / f"{sha(libs.v1)}.so").unlink()
    out += [("missing-backup-previous", missing, "previous"), ("missing-backup-vendor", missing, "vendor")]
    walked = fresh("all-rolled-back", libs.v1)
    rollback(LocalTransport(walked), DIR, operator="t")
    out += [("all-rolled-back", walked, "previous")]
    by_sha = fresh("by-sha", libs.v1, libs.v2)
    out += [("by-sha", by_sha, sha(libs.vendor)[:6].upper()), ("by-sha-unknown", by_sha, "abcdef0"),
            ("by-sha-too-short", by_sha, "abc")]
    return out


def test_the_cli_and_the_role_choose_the_same_rollback(nodes: list[Node], libs: Libs, tmp_path: Path) -> None:
    states = _states(tmp_path, libs)
    cli, role, lines = {}, {}, ["[gpu]"]
    for i, (name, root, to) in enumerate(states):
        a, b = tmp_path / "cli" / name, tmp_path / "role" / name
        shutil.copytree(root, a, symlinks=True)
        shutil.copytree(root, b, symlinks=True)
        cli[name], role[name] = a, b
        sshd = nodes[i % len(nodes)].sshd
        lines.append(f"{name} {sshd.inventory_vars()} vgpu_patch_target_dir={_ini_quote(str(b / 'usr/local/vgpu'))} "
                     f"vgpu_patch_rollback_to={_ini_quote(to)} ansible_python_interpreter={sys.executable}")
    inv = tmp_path / "inv.ini"
    inv.write_text("\n".join(lines) + "\n")
    run = run_playbook("rollback.yml", inv, {"vgpu_patch_serial": "100%", "vgpu_patch_max_fail_percentage": 100})
    by_role = {"restored": 0, "refused": 0}
    for name, _, to in states:
        try:
            r = rollback(LocalTransport(cli[name]), DIR, to_sha256=to, operator="t")
            cli_says, why = r.to_sha256, ""
        except VgpuPatchError as e:
            cli_says, why = None, str(e).split(f"{DIR}: ", 1)[-1]
        role_failed = run.recap[name]["failed"] > 0
        live_cli = cli[name] / "usr/local/vgpu"
        live_role = role[name] / "usr/local/vgpu"
        if cli_says is None:
            assert role_failed, f"{name}: the CLI refused ({why}) but the role rolled back"
            said = _failure(run.output, name)
            if name in LIVE_REFUSALS:  # which file is live is unclear: both refuse before choosing a backup
                assert LIVE_REFUSALS[name] in why and LIVE_REFUSALS[name] in said, (name, why, said)
                by_role["refused"] += 1
                continue
            reason = why.replace(str(live_cli), str(live_role)).split("; nothing was changed")[0]
            assert reason and reason in said, f"{name}: the CLI refused with {reason!r}; the role said {said!r}"
            by_role["refused"] += 1
        else:
            said = _failure(run.output, name)
            assert not role_failed, f"{name}: the CLI restored {cli_says[:12]}, the role refused: {said}"
            assert _live_sha(live_cli) == _live_sha(live_role) == cli_says, name
            by_role["restored"] += 1
    assert by_role["restored"] >= 10 and by_role["refused"] >= 5, by_role


def _live_sha(libdir: Path) -> str:
    names = [p for p in libdir.iterdir() if p.name.startswith("libvgpu.so") and p.is_file() and not p.is_symlink()]
    hist = [json.loads(x) for x in (libdir / ".vgpu-patch/history.jsonl").read_text().splitlines()]
    live = Path(hist[-1]["path"]).name
    assert any(p.name == live for p in names)
    return sha(libdir / live)


def _failure(output: str, host: str) -> str:
    return "\n".join(m.group(0) for m in re.finditer(rf"fatal: \[{re.escape(host)}\].*(?:\n(?!\S).*)*", output))
