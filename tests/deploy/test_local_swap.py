"""The swap protocol over the local transport (a fake node root): the guarantees of docs/node-state.md."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from deploy_support import assert_whole, leftovers, make_node, sha

from vgpu_patch.deploy.request import SwapHooks
from vgpu_patch.deploy.swap import deploy_file, node_status, rollback
from vgpu_patch.report.errors import DeployError, IntegrityError, LockedError
from vgpu_patch.transport.local import LocalTransport

DIR = "/usr/local/vgpu"


@pytest.fixture()
def node(tmp_path: Path, libs: dict[str, Path]):
    root = tmp_path / "root"
    d = make_node(root, libs["vendor"])
    return LocalTransport(root), d


def test_happy_path_records_backup_and_history(node, libs) -> None:
    t, d = node
    r = deploy_file(t, libs["v1"], DIR, operator="tester@here")
    assert r.changed and r.from_sha256 == sha(libs["vendor"]) and r.to_sha256 == sha(libs["v1"])
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    backup = d / ".vgpu-patch" / "backups" / f"{sha(libs['vendor'])}.so"
    assert backup.read_bytes() == libs["vendor"].read_bytes()
    assert r.backup == f"{DIR}/.vgpu-patch/backups/{sha(libs['vendor'])}.so"
    manifest = json.loads(backup.with_suffix(".json").read_text())
    assert set(manifest) == {"sha256", "size", "path", "saved_at", "operator", "tool"}
    assert manifest["operator"] == "tester@here" and manifest["path"] == f"{DIR}/libvgpu.so"
    (entry,) = [json.loads(x) for x in (d / ".vgpu-patch" / "history.jsonl").read_text().splitlines()]
    assert entry["action"] == "deploy" and entry["to_sha256"] == sha(libs["v1"])
    assert entry["from_sha256"] == sha(libs["vendor"]) and entry["tool"].startswith("vgpu-patch ")
    assert oct((d / "libvgpu.so").stat().st_mode & 0o777) == "0o644"
    assert leftovers(d) == []
    assert not list((t.root / "tmp").glob(".vgpu-patch-upload-*")), "the upload must be removed"


def test_same_sha_is_a_noop(node, libs) -> None:
    t, d = node
    deploy_file(t, libs["v1"], DIR, operator="a")
    before = (d / ".vgpu-patch" / "history.jsonl").read_text()
    r = deploy_file(t, libs["v1"], DIR, operator="a")
    assert not r.changed and r.plan[0].kind == "noop"
    assert (d / ".vgpu-patch" / "history.jsonl").read_text() == before


def test_dry_run_changes_nothing(node, libs) -> None:
    t, d = node
    r = deploy_file(t, libs["v1"], DIR, operator="a", dry_run=True)
    assert r.pending and not r.changed
    assert [s.kind for s in r.plan][:4] == ["prepare", "verify", "lock", "upload"]
    # the plan carries the calls: the script that would run is exactly its calls joined, after node.sh, whose
    # functions each step's `code` shows
    from vgpu_patch.deploy import script

    sent = script.script([s.sh for s in r.plan], with_program=True)
    assert all(s.sh in sent for s in r.plan) and all(s.code in sent for s in r.plan)
    codes = "\n".join(s.code for s in r.plan)
    assert "flock -n 9" in codes and "mv -f \"$TMP\" \"$LIVE\"" in codes
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    assert not (d / ".vgpu-patch").exists()


def test_rollback_is_byte_identical_and_chosen_backup(node, libs) -> None:
    t, d = node
    deploy_file(t, libs["v1"], DIR, operator="a")
    deploy_file(t, libs["v2"], DIR, operator="a")
    r = rollback(t, DIR, operator="b")
    assert r.changed and r.to_sha256 == sha(libs["v1"])
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    r = rollback(t, DIR, operator="b", to_sha256=sha(libs["vendor"])[:10])
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()
    actions = [json.loads(x)["action"] for x in (d / ".vgpu-patch" / "history.jsonl").read_text().splitlines()]
    assert actions == ["deploy", "deploy", "rollback", "rollback"]
    with pytest.raises(DeployError, match="no backups match"):
        rollback(t, DIR, operator="b", to_sha256="abcdef")


def test_rollback_refuses_a_corrupted_backup(node, libs) -> None:
    t, d = node
    deploy_file(t, libs["v1"], DIR, operator="a")
    backup = d / ".vgpu-patch" / "backups" / f"{sha(libs['vendor'])}.so"
    backup.write_bytes(backup.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(IntegrityError):
        rollback(t, DIR, operator="a")
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()


def test_no_library_needs_install(tmp_path: Path, libs) -> None:
    root = tmp_path / "root"
    d = make_node(root, None)
    t = LocalTransport(root)
    with pytest.raises(DeployError, match="--install"):
        deploy_file(t, libs["v1"], DIR, operator="a")
    r = deploy_file(t, libs["v1"], DIR, operator="a", install=True)
    assert r.changed and r.from_sha256 is None and r.backup is None
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()


def test_a_missing_directory_is_created_by_install_as_the_hint_says(tmp_path: Path, libs) -> None:
    """No library directory at all: the error says so and names --install; with it, the directory is created
    (0755, parents too) and the library installed; the dry run lists that step."""
    from click.testing import CliRunner

    from vgpu_patch.cli import cli

    root = tmp_path / "root"
    root.mkdir()
    d = root / DIR.lstrip("/")
    t = LocalTransport(root)
    with pytest.raises(DeployError) as e:
        deploy_file(t, libs["v1"], DIR, operator="a")
    assert str(e.value) == (f"{t.name}:{DIR}: the directory does not exist (is HAMi installed? check --target-dir); "
                            "pass --install to create it and install libvgpu.so there")
    assert not d.exists()
    args = ["deploy", "--local", str(root), "--no-check", "--install", str(libs["v1"])]
    plan = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert plan.exit_code == 1 and f"create  create {DIR} (mode 0755, with its parents)" in plan.stdout, plan.output
    assert not d.exists()
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["nodes"][0]["status"] == "changed"
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    assert d.stat().st_mode & 0o777 == 0o755 and d.parent.stat().st_mode & 0o777 == 0o755
    assert node_status(t, DIR).sha256 == sha(libs["v1"]) and leftovers(d) == []


def test_versioned_file_is_the_live_one(tmp_path: Path, libs) -> None:
    root = tmp_path / "root"
    d = make_node(root, libs["vendor"], name="libvgpu.so.v2.4.1")
    shutil.copyfile(libs["v3"], d / "libvgpu.so")  # ignored by HAMi when a versioned file exists
    (d / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")  # HAMi's in-container path: fine
    t = LocalTransport(root)
    r = deploy_file(t, libs["v1"], DIR, operator="a")
    assert r.path == f"{DIR}/libvgpu.so.v2.4.1"
    assert (d / "libvgpu.so.v2.4.1").read_bytes() == libs["v1"].read_bytes()
    assert (d / "libvgpu.so").read_bytes() == libs["v3"].read_bytes()


@pytest.mark.parametrize("case", ["two-versioned", "preload-other", "symlink"])
def test_ambiguous_directory_is_refused(tmp_path: Path, libs, case: str) -> None:
    root = tmp_path / "root"
    d = make_node(root, libs["vendor"], name="libvgpu.so.1")
    if case == "two-versioned":
        shutil.copyfile(libs["v3"], d / "libvgpu.so.2")
        match = "libvgpu.so.1, libvgpu.so.2"
    elif case == "preload-other":
        (d / "ld.so.preload").write_text("# HAMi\n/usr/local/vgpu/libvgpu-old.so\n")
        match = "ld.so.preload names /usr/local/vgpu/libvgpu-old.so"
    else:
        (d / "libvgpu.so.1").rename(d / "real.so")
        (d / "libvgpu.so.1").symlink_to("real.so")
        match = "symlink"
    with pytest.raises(DeployError, match=match):
        deploy_file(LocalTransport(root), libs["v1"], DIR, operator="a")
    st = node_status(LocalTransport(root), DIR)
    assert st.problem and st.sha256 is None


def test_wrong_arch_is_refused_before_upload(tmp_path: Path, node, libs) -> None:
    t, d = node
    arm = tmp_path / "arm.so"
    data = bytearray(libs["v1"].read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine = EM_AARCH64
    arm.write_bytes(bytes(data))
    with pytest.raises(DeployError, match="built for EM_AARCH64 but the node is x86_64"):
        deploy_file(t, arm, DIR, operator="a")
    assert not (d / ".vgpu-patch").exists()


def test_library_that_does_not_load_is_refused(tmp_path: Path, node, libs) -> None:
    t, d = node
    bad_src = tmp_path / "bad.c"
    bad_src.write_text("#include <unistd.h>\n__attribute__((constructor)) static void die(void) { _exit(3); }\n")
    bad = tmp_path / "bad.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(bad), str(bad_src)], check=True)
    with pytest.raises(DeployError, match="LD_PRELOAD of the new file made /bin/true fail"):
        deploy_file(t, bad, DIR, operator="a")
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert leftovers(d) == []


def test_sha256_mismatch_injected_after_upload(node, libs) -> None:
    t, d = node

    def corrupt(path: str) -> None:
        with open(path, "r+b") as f:
            f.seek(4096)
            f.write(b"\xff" * 16)

    with pytest.raises(IntegrityError, match=r"sha256 of .* expected"):
        deploy_file(t, libs["v1"], DIR, operator="a", hooks=SwapHooks(after_upload=corrupt))
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert leftovers(d) == []
    assert not (d / ".vgpu-patch" / "history.jsonl").exists()


def test_lock_held_gives_locked_error(node, libs) -> None:
    t, d = node
    (d / ".vgpu-patch").mkdir()
    # its own session: killing the group also ends the `sleep` that inherited the locked fd
    holder = subprocess.Popen(["flock", str(d / ".vgpu-patch" / "lock"), "sleep", "30"], start_new_session=True)
    try:
        for _ in range(100):  # wait until the holder really has it
            if subprocess.run(["flock", "-n", str(d / ".vgpu-patch" / "lock"), "true"]).returncode:
                break
        with pytest.raises(LockedError, match=r"holds /usr/local/vgpu/.vgpu-patch/lock"):
            deploy_file(t, libs["v1"], DIR, operator="a")
    finally:
        os.killpg(holder.pid, 9)
        holder.wait()
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert deploy_file(t, libs["v1"], DIR, operator="a").changed


def test_mkdir_lock_when_flock_is_missing(tmp_path: Path, node, libs, monkeypatch) -> None:
    t, d = node
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "sha256sum", "cut", "mv", "cp", "rm", "mkdir", "rmdir", "sync", "chmod", "chown", "stat",
                 "date", "id", "cat", "tr", "grep", "head", "tail", "sort", "uname", "getconf", "df", "dirname",
                 "readlink", "true", "cmp"):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bindir))
    (d / ".vgpu-patch").mkdir()
    (d / ".vgpu-patch" / "lock.d").mkdir()
    with pytest.raises(LockedError):
        deploy_file(t, libs["v1"], DIR, operator="a")
    (d / ".vgpu-patch" / "lock.d").rmdir()
    assert deploy_file(t, libs["v1"], DIR, operator="a").changed
    assert not (d / ".vgpu-patch" / "lock.d").exists()


def test_concurrent_deploys_one_wins(node, libs) -> None:
    t, d = node
    results: dict[str, object] = {}
    hooks = SwapHooks(in_lock="sleep 1")

    def go(name: str) -> None:
        try:
            results[name] = deploy_file(LocalTransport(t.root), libs[name], DIR, operator=name, hooks=hooks)
        except Exception as e:  # any failure: the test sorts them out
            results[name] = e

    threads = [threading.Thread(target=go, args=(n,)) for n in ("v1", "v2")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    errors = [r for r in results.values() if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], LockedError), results
    winner = next(n for n, r in results.items() if not isinstance(r, Exception))
    assert_whole(d / "libvgpu.so", libs[winner])
    assert leftovers(d) == []


@pytest.fixture()
def small_tmpfs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
        if proc.returncode:
            pytest.skip(f"cannot mount tmpfs here: {proc.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for p in mounted:
        subprocess.run(["umount", "-l", str(p)], check=False)


def test_disk_full_is_refused_by_preflight(tmp_path: Path, libs, small_tmpfs) -> None:
    root = tmp_path / "root"
    d = small_tmpfs(root / "usr/local/vgpu", "1m")
    shutil.copyfile(libs["vendor"], d / "libvgpu.so")
    with pytest.raises(DeployError, match="not enough free space"):
        deploy_file(LocalTransport(root), libs["v1"], DIR, operator="a")
    assert_whole(d / "libvgpu.so", libs["vendor"])


def test_disk_filling_up_during_the_swap_leaves_the_old_file(tmp_path: Path, libs, small_tmpfs) -> None:
    root = tmp_path / "root"
    d = small_tmpfs(root / "usr/local/vgpu", "4m")
    shutil.copyfile(libs["vendor"], d / "libvgpu.so")

    def fill(_: str) -> None:  # after preflight passed: eat every free block
        subprocess.run(["dd", "if=/dev/zero", f"of={d / 'filler'}", "bs=64k"], capture_output=True)

    with pytest.raises(DeployError, match="disk full"):
        deploy_file(LocalTransport(root), libs["v1"], DIR, operator="a", hooks=SwapHooks(after_upload=fill))
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert leftovers(d) == []
    (d / "filler").unlink()
    assert deploy_file(LocalTransport(root), libs["v1"], DIR, operator="a").changed


def test_process_mapping_the_old_library_keeps_running(tmp_path: Path, node, libs) -> None:
    t, d = node
    live = d / "libvgpu.so"
    child_src = tmp_path / "child.py"
    child_src.write_text(
        "import ctypes, mmap, sys, time, hashlib\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "first = hashlib.sha256(m[:]).hexdigest()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"  # the test swaps the library meanwhile
        "for _ in range(20):\n"
        "    assert hashlib.sha256(m[:]).hexdigest() == first\n"
        "    assert lib.vgpu_test_version() == 7\n"
        "    time.sleep(0.01)\n"
        "print('ok', first, flush=True)\n"
    )
    child = subprocess.Popen(
        [os.environ.get("PYTHON", "python3"), str(child_src), str(live)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert node_status(t, DIR).stale_pids == []
        # the report reads every process's maps only when asked
        assert "STALE=0" in deploy_file(t, libs["v1"], DIR, operator="a", dry_run=True).plan[0].sh
        r = deploy_file(t, libs["v1"], DIR, operator="a", stale=True)
        assert child.pid in r.stale_pids and "STALE=1" in r.plan[0].sh
        st = node_status(t, DIR)
        assert child.pid in st.stale_pids and st.ours and st.version == "0.1.0"
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, "the process using the old library died (SIGBUS?)"
    assert out.split() == ["ok", sha(libs["vendor"])]
    assert node_status(t, DIR).stale_pids == []


def test_status_reports_vendor_backups_history(node, libs) -> None:
    t, _d = node
    st = node_status(t, DIR)
    assert not st.ours and st.sha256 == sha(libs["vendor"]) and st.backups == [] and st.history == []
    deploy_file(t, libs["v1"], DIR, operator="a")
    deploy_file(t, libs["v2"], DIR, operator="a")
    st = node_status(t, DIR, history=1)
    assert st.ours and st.version == "0.2.0" and len(st.backups) == 2 and len(st.history) == 1
    assert st.history[0]["to_sha256"] == sha(libs["v2"])


def test_check_against_the_live_vendor_file_refuses_a_bad_candidate(node, libs) -> None:
    pytest.importorskip("vgpu_patch.elf.check")
    t, d = node
    # our toy library exports none of the interposition surface: `check` must block it
    with pytest.raises(DeployError, match=r"vgpu-patch check found .* blocking problem"):
        deploy_file(t, libs["v1"], DIR, operator="a", check=True)
    assert_whole(d / "libvgpu.so", libs["vendor"])
    assert not (d / ".vgpu-patch").exists()


def test_glibc_too_new_for_the_node_is_refused(node, libs) -> None:
    from dataclasses import replace

    from vgpu_patch.deploy import facts as F
    from vgpu_patch.deploy.candidate import inspect
    from vgpu_patch.deploy.ops import preflight

    t, _ = node
    facts = F.gather(t, DIR, maps=False)
    live = F.choose_live(facts, t.name)
    cand = replace(inspect(libs["v1"]), glibc_needed=(2, 99))
    with pytest.raises(DeployError, match=r"needs GLIBC_2.99 but the node has glibc 2\.\d+"):
        preflight(facts, cand, t.name, live, install=False)
    with pytest.raises(DeployError, match="GLIBC_PRIVATE"):
        preflight(facts, replace(cand, glibc_needed=None, glibc_private=True), t.name, live, install=False)


def test_fleet_result_raises_one_error_carrying_every_node(tmp_path: Path, libs) -> None:
    from vgpu_patch.deploy.fleet import run_fleet
    from vgpu_patch.deploy.targets import HostSpec, make_transport
    from vgpu_patch.report.errors import FleetError

    specs = []
    for i in range(4):
        root = tmp_path / f"n{i}"
        make_node(root, None if i == 2 else libs["vendor"])
        specs.append(HostSpec(name=f"n{i}", local_root=str(root)))

    def op(t, spec):  # type: ignore[no-untyped-def]
        r = deploy_file(t, libs["v1"], DIR, operator="a")
        return ("changed" if r.changed else "unchanged"), r

    res = run_fleet(specs, op, make_transport, parallel=1, canary=1, keep_going=True)
    assert [o.status for o in res.outcomes] == ["changed", "changed", "failed", "changed"]
    assert res.exit_code() == 3
    with pytest.raises(FleetError) as e:
        res.raise_for_failures()
    assert set(e.value.results) == {"n0", "n1", "n2", "n3"} and e.value.exit_code == 3
    res = run_fleet(specs, op, make_transport, parallel=2, canary=0, keep_going=False)
    assert res.exit_code() == 3  # the failed node's neighbours are already on v1


def test_live_file_rewritten_in_place_between_plan_and_swap(node, libs) -> None:
    """HAMi's plugin `cp`s over the live file outside any lock: the swap records what it really replaced."""
    t, d = node

    def hami_copy_back(_: str) -> None:
        with open(libs["v3"], "rb") as src, open(d / "libvgpu.so", "r+b") as out:
            out.truncate(0)
            shutil.copyfileobj(src, out)

    r = deploy_file(t, libs["v1"], DIR, operator="a", hooks=SwapHooks(after_upload=hami_copy_back))
    assert r.changed and r.from_sha256 == sha(libs["v3"])
    assert (d / "libvgpu.so").read_bytes() == libs["v1"].read_bytes()
    assert (d / ".vgpu-patch" / "backups" / f"{sha(libs['v3'])}.so").read_bytes() == libs["v3"].read_bytes()
    (entry,) = [json.loads(x) for x in (d / ".vgpu-patch" / "history.jsonl").read_text().splitlines()]
    assert entry["from_sha256"] == sha(libs["v3"])
    assert rollback(t, DIR, operator="a").to_sha256 == sha(libs["v3"])


def test_operator_text_is_recorded_verbatim(node, libs) -> None:
    t, d = node
    who = 'ops "night" 100% \\ ünïcode'
    deploy_file(t, libs["v1"], DIR, operator=who, tool="tool %s \\n")
    (entry,) = [json.loads(x) for x in (d / ".vgpu-patch" / "history.jsonl").read_text().splitlines()]
    assert entry["operator"] == who and entry["tool"] == "tool %s \\n"
    manifest = json.loads((d / ".vgpu-patch" / "backups" / f"{sha(libs['vendor'])}.json").read_text())
    assert manifest["operator"] == who and manifest["size"] == libs["vendor"].stat().st_size
    assert manifest["saved_at"] == entry["time"] and entry["time"].endswith("Z")


def test_one_session_runs_only_a_whole_script(node, libs) -> None:
    """The probe waits for `@@go N` and N bytes: a script cut short is refused, EOF ends it quietly."""
    from vgpu_patch.deploy import facts as F
    from vgpu_patch.deploy import script as S

    t, d = node
    probe = F.probe_script(t.path(DIR), maps=False) + S.AWAIT
    marker = d / "ran"
    body = f": > {marker}\n{S.SCRIPT_END}\n".encode()
    stream = t.open_stream(probe, sudo=True, timeout=30)
    assert stream is not None and "@@vgpu arch" in stream.read_until(S.PROBE_END)
    stream.send(f"@@go {len(body)}\n".encode() + body[:-8])  # cut before its end line is complete
    res = stream.finish()
    assert res.exited == 71 and "arrived cut" in res.stdout and not marker.exists()
    stream = t.open_stream(probe, sudo=True, timeout=30)
    assert stream is not None
    stream.read_until(S.PROBE_END)
    res = stream.finish()  # nothing to do: EOF instead of a script
    assert res.ok and res.stdout == "" and not marker.exists()
    stream = t.open_stream(probe, sudo=True, timeout=30)
    assert stream is not None
    stream.read_until(S.PROBE_END)
    stream.send(b"a stray line (an unread sudo password, say)\n" + f"@@go {len(body)}\n".encode() + body)
    assert stream.finish().ok and marker.exists()
    assert (d / "libvgpu.so").read_bytes() == libs["vendor"].read_bytes()


def test_a_backup_left_without_its_manifest_is_made_visible_again(node, libs) -> None:
    """A crash between a backup's file and its manifest: the next swap of that file writes both again."""
    t, d = node
    assert deploy_file(t, libs["v1"], DIR, operator="a").changed
    manifest = d / ".vgpu-patch" / "backups" / f"{sha(libs['v1'])}.json"
    assert rollback(t, DIR, operator="a").changed  # v1 is backed up (file and manifest)
    manifest.unlink()
    assert sha(libs["v1"]) not in [b["sha256"] for b in node_status(t, DIR).backups]
    assert deploy_file(t, libs["v1"], DIR, operator="a").changed and rollback(t, DIR, operator="a").changed
    assert manifest.exists() and sha(libs["v1"]) in [b["sha256"] for b in node_status(t, DIR).backups]
    assert leftovers(d) == []
